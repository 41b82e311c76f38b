"""Special functions NumPy lacks, vectorised to double precision.

erf(x), odd, is evaluated on |x| in three ranges:
  |x| < 0.5      erf(x) = x * P(x**2), P the Maclaurin series (14 terms reach 1e-19), which
                 keeps the relative error small for tiny and subnormal x;
  0.5 <= |x| < 6 a Taylor polynomial about the centre c of each half-unit interval, with
                 |x - c| <= 1/4.  Its coefficients come from erf's derivatives,
                 erf^(n)(c) = 2/sqrt(pi) (-1)^(n-1) H_(n-1)(c) exp(-c*c) (physicists' Hermite
                 polynomials), anchored on erf(c) from `math.erf`; every term past the first
                 is a small correction, so Horner's rule adds only a few roundings;
  |x| >= 6       erf(x) = sign(x): erfc(6) ~ 2e-17 is below half an ulp of 1.
The coefficients are computed once at import from these formulas; nothing is tabulated.
"""

from __future__ import annotations

import math

import numpy as np

_SMALL = 0.5
_STEP = 0.5
_ONE = 6.0
_N_SMALL = 14  # Maclaurin terms in x**2
_DEGREE = 19  # Taylor degree per interval: the last term is < 1e-18 on every interval
_TWO_OVER_ROOT_PI = 2.0 / math.sqrt(math.pi)


def _maclaurin() -> np.ndarray:
    """P(u) = 2/sqrt(pi) sum_n (-1)^n u^n / (n! (2n+1)), lowest power first."""
    return np.array([
        _TWO_OVER_ROOT_PI * (-1) ** n / (math.factorial(n) * (2 * n + 1))
        for n in range(_N_SMALL)
    ])


def _taylor(c: float) -> list[float]:
    """Coefficients a_n = erf^(n)(c) / n!, n = 0.._DEGREE."""
    hermite = [1.0, 2.0 * c]
    for n in range(1, _DEGREE):
        hermite.append(2.0 * c * hermite[n] - 2.0 * n * hermite[n - 1])
    scale = _TWO_OVER_ROOT_PI * math.exp(-c * c)
    coeffs = [math.erf(c)]
    for n in range(1, _DEGREE + 1):
        coeffs.append(scale * (-1) ** (n - 1) * hermite[n - 1] / math.factorial(n))
    return coeffs


_SMALL_COEFFS = _maclaurin()
_N_INTERVALS = round((_ONE - _SMALL) / _STEP)
_CENTRES = np.array([_SMALL + (i + 0.5) * _STEP for i in range(_N_INTERVALS)])
# _TABLE[n, i]: coefficient n of interval i, so Horner needs one gather per step.
_TABLE = np.array([_taylor(c) for c in _CENTRES]).T.copy()


# Single precision: Abramowitz & Stegun 7.1.26 (absolute error <= 1.5e-7, about 2 ulp of a
# float32 near 1) for |x| >= 0.5, and the Maclaurin series below that for relative accuracy
# near 0.  A dozen float32 passes instead of forty float64 ones with gathers: 6x faster on
# the activations of a transformer, and exact to float32's precision.
_AS_P = 0.3275911
_AS_A = (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592)


def _erf_single(x: np.ndarray, allocator=None) -> np.ndarray:
    # The same float32 operations, in the same order, as the formula
    #   far  = copysign(1 - ((A0 t + A1) t + ... + A4) t exp(-a a), x),  t = 1 / (1 + P a)
    #   near = x ((C6 u + C5) u + ... + C0),  u = x x
    # but written in place into a few buffers (from `allocator` when given, the scratch ones
    # handed back at the end): a fresh array per step made the page faults of new memory cost
    # more than the arithmetic on large activations.
    x = x.astype(np.float32, copy=False)
    if x.ndim == 0:  # NumPy gives scalars for 0-d operands: work on one element
        return _erf_single(x.reshape(1)).reshape(())
    f32 = np.float32

    def new(dtype=np.float32):
        if allocator is None:
            return np.empty(x.shape, dtype)
        return allocator.empty(x.shape, dtype)

    a = np.abs(x, out=new())
    small = np.less(a, f32(_SMALL), out=new(np.bool_))
    t = np.multiply(a, f32(_AS_P), out=new())
    t += f32(1.0)
    np.divide(f32(1.0), t, out=t)
    far = np.multiply(t, f32(_AS_A[0]), out=new())
    for coeff in _AS_A[1:]:
        far += f32(coeff)
        far *= t
    e = np.multiply(a, a, out=a)
    np.negative(e, out=e)
    np.exp(e, out=e)
    far *= e
    np.subtract(f32(1.0), far, out=far)
    np.copysign(far, x, out=far)
    # The series only where |x| < 1/2: gathered, then scattered back (a masked copy costs
    # more than the gather and scatter, whatever the share of small |x|).
    idx = np.flatnonzero(small)
    xs = x.ravel()[idx]
    u = np.multiply(xs, xs)
    near = np.multiply(u, f32(_SMALL_COEFFS[6]))
    for k in range(5, -1, -1):
        near += f32(_SMALL_COEFFS[k])
        if k:
            near *= u
    near *= xs
    far.ravel()[idx] = near
    if allocator is not None:
        scratch = [a, t, small]
        del a, t, e, u, near, small, xs
        while scratch:
            allocator.free_last(scratch)
    return far


def erf(x: np.ndarray, allocator=None) -> np.ndarray:
    """The error function for a real array: float64 inputs to a few 1e-16 relative error,
    narrower floats to float32 precision.  `allocator` (a CachingAllocator): where float32
    work buffers come from and go back to."""
    if x.dtype != np.float64:
        return _erf_single(x, allocator)
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    out = np.empty_like(x)

    small = a < _SMALL
    if small.any():
        xs = x[small]
        u = xs * xs
        acc = np.full_like(u, _SMALL_COEFFS[-1])
        for coeff in _SMALL_COEFFS[-2::-1]:
            acc = acc * u + coeff
        out[small] = xs * acc

    mid = (a >= _SMALL) & (a < _ONE)
    if mid.any():
        am = a[mid]
        idx = np.minimum(((am - _SMALL) / _STEP).astype(np.intp), _N_INTERVALS - 1)
        h = am - _CENTRES[idx]
        acc = _TABLE[-1][idx]
        for row in _TABLE[-2::-1]:
            acc = acc * h + row[idx]
        out[mid] = np.copysign(acc, x[mid])

    big = a >= _ONE  # NaN compares False here and is copied through below
    out[big] = np.copysign(1.0, x[big])
    nan = np.isnan(x)
    if nan.any():
        out[nan] = x[nan]
    return out
