"""Typed wrappers over Apache DataSketches: create, update, merge, serialize, estimate with bounds.

The bytes are the DataSketches compact formats, the same that Spark's hll_sketch_agg and
kll_sketch_agg_double produce, so sketches built on executors merge here unchanged.
"""

from sketches.hll import DEFAULT_LG_K, HllSketch
from sketches.kll import DEFAULT_K, KllSketch

__all__ = ["DEFAULT_K", "DEFAULT_LG_K", "HllSketch", "KllSketch"]
