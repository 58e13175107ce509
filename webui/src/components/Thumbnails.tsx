import { dataUrl } from "../images";
import type { ImageFile } from "../store";

// Small previews of attached images; a name stands in for an image whose bytes were not kept.
export function Thumbnails({ images, onRemove, testId = "thumbnails" }: {
  images: ImageFile[];
  onRemove?: (index: number) => void;
  testId?: string;
}) {
  if (!images.length) return null;
  return (
    <div className="thumbs" data-testid={testId}>
      {images.map((img, i) => (
        <figure key={i} className="thumb" title={img.name}>
          {img.data ? <img src={dataUrl(img)} alt={img.name} /> : <span className="muted">{img.name} (not kept)</span>}
          {onRemove && <button className="icon" title={`Remove ${img.name}`} onClick={() => onRemove(i)}>×</button>}
        </figure>
      ))}
    </div>
  );
}
