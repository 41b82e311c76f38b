"""torch.backends.cuda: no CUDA here.  matmul's precision flags and the scaled-dot-product
attention backend switches are kept as set."""

from __future__ import annotations

__all__ = ["cuBLASModule", "enable_flash_sdp", "enable_math_sdp", "enable_mem_efficient_sdp",
           "flash_sdp_enabled", "is_built", "math_sdp_enabled", "matmul",
           "mem_efficient_sdp_enabled"]


def is_built() -> bool:
    return False


class cuBLASModule:  # noqa: N801 - torch's name
    """torch.backends.cuda.matmul: allow_tf32 and the reduced-precision-reduction flags."""

    _FLAGS = ("allow_tf32", "allow_fp16_reduced_precision_reduction",
              "allow_bf16_reduced_precision_reduction", "allow_fp16_accumulation")

    def __init__(self):
        d = self.__dict__
        d["allow_fp16_reduced_precision_reduction"] = True
        d["allow_bf16_reduced_precision_reduction"] = True
        d["allow_fp16_accumulation"] = False

    def __getattr__(self, name):
        if name == "allow_tf32":  # torch: the float32 matmul precision is not "highest"
            return _matmul_precision[0] != "highest"
        raise AttributeError(f"Unknown attribute {name}")

    def __setattr__(self, name, value):
        if name not in self._FLAGS:
            raise AttributeError(f"Unknown attribute {name}")
        if name == "allow_tf32":
            _matmul_precision[0] = "high" if value else "highest"
            return
        self.__dict__[name] = value


# torch.get/set_float32_matmul_precision's value, which matmul.allow_tf32 reads and writes
_matmul_precision = ["highest"]


matmul = cuBLASModule()

_SDP = {"flash": True, "mem_efficient": True, "math": True}


def flash_sdp_enabled() -> bool:
    return _SDP["flash"]


def enable_flash_sdp(enabled: bool) -> None:
    _SDP["flash"] = bool(enabled)


def mem_efficient_sdp_enabled() -> bool:
    return _SDP["mem_efficient"]


def enable_mem_efficient_sdp(enabled: bool) -> None:
    _SDP["mem_efficient"] = bool(enabled)


def math_sdp_enabled() -> bool:
    return _SDP["math"]


def enable_math_sdp(enabled: bool) -> None:
    _SDP["math"] = bool(enabled)
