"""Graph-only kernels: numba loops that replace an op's eager kernel inside a compiled graph
(registered in `ir.KERNEL_RESOLVERS` under an op type of their own; eager kernels unchanged)."""
