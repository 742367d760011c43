"""Defaults that several layers read: each fact in one place."""

#: The accuracy contract's default target: relative L1 residual of the returned scalings
#: against the TRUE kernel (balanced transport: the marginal error).
DEFAULT_ACCURACY = 1e-3

#: Largest dense ``n x m`` array built unless told otherwise (a stored exact kernel, a dense
#: plan): 1 GiB.
DEFAULT_MAX_DENSE_BYTES = 1 << 30
