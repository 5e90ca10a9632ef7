// A value's distribution over time from its KLL sketches: the page asks a few quantiles per
// step (HEATMAP_STATS, with the count) and spreads each step's events over value bins between
// them, reading the quantiles as a piecewise-linear distribution function. Pure.

const HEATMAP_QUANTILES = [["p1", 0.01], ["p10", 0.1], ["p25", 0.25], ["p50", 0.5], ["p75", 0.75],
  ["p90", 0.9], ["p99", 0.99]];
export const HEATMAP_STATS = [...HEATMAP_QUANTILES.map(([s]) => s), "count"];

// The fraction of values at or below v, from knots [[value, rank], ...] sorted by value; the
// 1 % below the first and above the last knot are left out (a distribution's tails would
// stretch the bins over nothing).
function cdf(knots, v) {
  if (v <= knots[0][0]) return knots[0][1];
  for (let i = 1; i < knots.length; i++) {
    const [v1, r1] = knots[i], [v0, r0] = knots[i - 1];
    if (v <= v1) return v1 === v0 ? r1 : r0 + (r1 - r0) * (v - v0) / (v1 - v0);
  }
  return knots[knots.length - 1][1];
}

// steps: [{t, count, values: {p1: v, ...}}] -> {x: [t], y: [bin centres], z: [bin][t] events}
export function distribution(steps, bins = 24) {
  const usable = steps.filter((s) => s.count > 0 && HEATMAP_QUANTILES.every(([q]) => Number.isFinite(s.values[q])));
  if (!usable.length) return { x: [], y: [], z: [] };
  const lo = Math.min(...usable.map((s) => s.values.p1));
  const hi = Math.max(...usable.map((s) => s.values.p99));
  const width = hi > lo ? (hi - lo) / bins : 1;
  const y = Array.from({ length: bins }, (_, i) => lo + width * (i + 0.5));
  const z = y.map(() => []);
  for (const s of usable) {
    const knots = HEATMAP_QUANTILES.map(([q, rank]) => [s.values[q], rank]);
    for (let b = 0; b < bins; b++) {
      const a = lo + width * b;
      const share = hi > lo ? cdf(knots, a + width) - cdf(knots, a) : (b === 0 ? 0.98 : 0);
      z[b].push(Math.max(0, share) * s.count);
    }
  }
  return { x: usable.map((s) => s.t), y, z };
}
