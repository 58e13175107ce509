import type { ImageFile } from "./store";

// The server's own bound (MLXR_MAX_IMAGE_BYTES' default): a bigger file is refused here, not
// sent to be refused. The server checks the format; the browser only sorts files by type.
export const MAX_IMAGE_BYTES = 20 * 1024 * 1024;
export const MAX_IMAGES = 8; // MLXR_MAX_IMAGES' default: images in one request

export const isImage = (f: File) => f.type.startsWith("image/");

function base64Of(buf: ArrayBuffer): string {
  const bytes = new Uint8Array(buf);
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

// Image files to attachments; a file over the bound comes back as an error naming it.
export async function readImages(files: File[]): Promise<{ images: ImageFile[]; errors: string[] }> {
  const images: ImageFile[] = [];
  const errors: string[] = [];
  for (const f of files) {
    if (f.size > MAX_IMAGE_BYTES) errors.push(`${f.name || "image"} is ${(f.size / 2 ** 20).toFixed(1)} MiB: the limit is 20 MiB`);
    else images.push({ name: f.name || "pasted image", mime: f.type, data: base64Of(await f.arrayBuffer()) });
  }
  return { images, errors };
}

// The files a drop or a paste carries.
export const filesOf = (dt: DataTransfer | null): File[] => [...(dt?.files ?? [])];

export const dataUrl = (i: ImageFile) => `data:${i.mime || "image/png"};base64,${i.data}`;
