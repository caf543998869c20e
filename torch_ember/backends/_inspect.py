"""What ember is and what it runs on: availability, versions, CPU features."""

from __future__ import annotations

import torch

from torch_ember import _C

_ISA_FEATURES = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512dq",
    "avx512_bf16",
    "avx512_vnni",
    "avx512_fp16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)


def is_built() -> bool:
    """True: this package is ember's compiled extension."""
    return True


def is_available() -> bool:
    """True when ember has a device to run on: the extension loaded and every
    EMBER_* variable is valid (else False with a warning naming it, and any
    use of ember raises that error; see torch.ember.is_available)."""
    return torch.ember.is_available()


def version() -> dict[str, str]:
    """ember's version and the versions of the libraries its kernels run."""
    import torch_ember

    versions = {"ember": torch_ember.__version__, "torch": torch.__version__}
    config = torch.__config__.show()
    for line in config.splitlines():
        line = line.strip()
        if "Math Kernel Library Version" in line:
            versions["mkl"] = line.split("Version", 1)[1].split("-")[0].strip()
        elif line.startswith(("- Intel(R) MKL-DNN v", "- Intel(R) oneDNN v")):
            versions["onednn"] = line.split(" v", 1)[1].split(" ")[0]
        elif line.startswith("- OpenMP"):
            # The OpenMP specification date torch was built against (201511 = 4.5).
            versions["openmp_spec"] = line.split("OpenMP", 1)[1].strip().split(" ")[0]
    return versions


def capabilities() -> dict[str, bool]:
    """ISA features detected with CPUID. AMX entries are True only when the
    CPU has them and the OS has enabled the AMX tile state for this process."""
    features = _C.cpu_features()
    return {name: bool(features[name]) for name in _ISA_FEATURES}


def get_cpu_capability() -> str:
    """The best kernel level in use: ATen's CPU dispatch level ("AVX512",
    "AVX2", "DEFAULT", ...), which is what ember's delegated kernels run."""
    return torch.backends.cpu.get_cpu_capability()
