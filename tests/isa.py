"""Which of ember's own kernels this CPU runs (tests that check a kernel's
route or launch skip where the CPU takes another one)."""

import torch

import torch_ember  # noqa: F401  (registers torch.backends.ember)

_caps = torch.backends.ember.capabilities()

# AVX-512F: ember's argmax and Winograd kernels (an AVX2 port of the
# Winograd route ran ResNet-50's 3x3 layers 1.2-1.7x slower than oneDNN's
# on an AMD Zen 3 host, so AVX2 CPUs keep oneDNN there).
AVX512 = bool(_caps["avx512f"])
# ember's elementwise (arithmetic, tanh, GELU, chains), batch-norm,
# attention, convolution-epilogue and max-pooling kernels: AVX-512F, or
# AVX2 + FMA.
VECTOR_KERNELS = AVX512 or bool(_caps["avx2"] and _caps["fma"])
# The panel GEMMs (skinny, tall, 1x1 convolution): AVX-512F, or AVX2 + FMA.
PANEL_GEMM = AVX512 or bool(_caps["avx2"] and _caps["fma"])
# bf16 arithmetic (VDPBF16PS or AMX): where "medium" precision computes in bf16
# (elsewhere only skinny GEMMs do, on bf16 panels widened to fp32).
NATIVE_BF16 = bool(_caps["avx512_bf16"] or _caps["amx_bf16"])
# ATen's oneDNN matmul and bf16 entry points (mkldnn_matmul, the bf16 weight
# reorder and convolution) refuse CPUs without AVX512BW/VL/DQ.
ONEDNN_MATMUL = bool(_caps["avx512bw"] and _caps["avx512vl"] and _caps["avx512dq"])
# The fp32 GEMM route of more than 16 rows: "mkl" (MKL's packed GEMM, Intel
# CPUs), "panels" (ember's panel kernel, the skinny kernel's bits) or "onednn".
TALL_GEMM = torch.backends.ember.packed_weights_info()["library"]
