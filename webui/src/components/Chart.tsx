import { useEffect, useRef } from "react";
import uPlot from "uplot";

const COLORS = ["#4f9cf9", "#f59e0b", "#10b981", "#ef4444"];

// A live line chart: x is seconds (unix), one series per label; `spanS`: the x axis always
// shows that many seconds up to the newest point, however few points there are yet.
// `idle`: said over the chart instead of letting flat zeros pass for measurements.
export function Chart({ title, labels, data, unit, idle, spanS }: {
  title: string; labels: string[]; data: (number | null)[][]; unit?: string; idle?: string; spanS?: number;
}) {
  const host = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  useEffect(() => {
    const el = host.current!;
    const opts: uPlot.Options = {
      width: Math.max(el.clientWidth, 200),
      height: 180,
      series: [{}, ...labels.map((l, i) => ({ label: l, stroke: COLORS[i % COLORS.length], width: 2 }))],
      axes: [{ stroke: "#888" }, { stroke: "#888", values: (_u, v) => v.map((x) => (x == null ? "" : `${+x.toPrecision(3)}${unit ?? ""}`)) }],
      legend: { live: false },
      scales: spanS ? { x: { time: true, range: (_u, _min, max) => [max - spanS, max] } } : undefined,
    };
    plot.current = new uPlot(opts, data as uPlot.AlignedData, el);
    const resize = () => plot.current?.setSize({ width: Math.max(el.clientWidth, 200), height: 180 });
    window.addEventListener("resize", resize);
    return () => { window.removeEventListener("resize", resize); plot.current?.destroy(); plot.current = null; };
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [labels.join("|")]);
  useEffect(() => { plot.current?.setData(data as uPlot.AlignedData); }, [data]);
  return (
    <figure className="chart">
      <figcaption>{title}</figcaption>
      <div className="chart-body">
        <div ref={host} />
        {idle && <div className="chart-idle" data-testid="chart-idle">{idle}</div>}
      </div>
    </figure>
  );
}
