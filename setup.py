"""Build of baracuda_torch and its one extension module, baracuda_torch._C.

CPU kernels are always built. CUDA kernels are built when torch was built
with CUDA and nvcc is found; BARACUDA_WITH_CUDA=0/1 overrides the detection
(1 fails loudly if CUDA cannot be built). TORCH_CUDA_ARCH_LIST picks the GPU
architectures and MAX_JOBS the parallel compile jobs (both read by
torch.utils.cpp_extension); ninja is used when installed.
"""

import glob
import os
import sys

import torch
from setuptools import find_packages, setup
from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.abspath(__file__))
KERNELS = os.path.join(ROOT, "kernels")


def want_cuda() -> bool:
    choice = os.environ.get("BARACUDA_WITH_CUDA", "auto").lower()
    available = torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None
    if choice in ("1", "true", "yes"):
        if not available:
            raise RuntimeError(
                "BARACUDA_WITH_CUDA=1 but torch has no CUDA or nvcc was not found "
                f"(torch.version.cuda={torch.version.cuda}, CUDA_HOME={cpp_extension.CUDA_HOME})"
            )
        return True
    if choice in ("0", "false", "no"):
        return False
    return available


def sources(with_cuda: bool) -> list:
    rel = lambda p: os.path.relpath(p, ROOT)  # noqa: E731
    files = sorted(glob.glob(os.path.join(KERNELS, "**", "*.cpp"), recursive=True))
    if not with_cuda:
        # The one op-layer file that includes torch's CUDA headers.
        files = [f for f in files if not f.endswith("cuda_stream.cpp")]
    else:
        files += sorted(glob.glob(os.path.join(KERNELS, "**", "*.cu"), recursive=True))
    return [rel(f) for f in files]


def link_args() -> list:
    # Bind the C++ runtime to the shared libstdc++ that torch itself uses.
    # Some toolchains put only libstdc++.a on their search path, so a plain
    # -lstdc++ links it statically: the extension then carries a second,
    # never-initialised copy of the iostream/locale machinery, and the first
    # error message that formats a number crashes. Naming the shared object
    # resolves every C++ runtime symbol before the archive is consulted.
    if sys.platform.startswith("linux"):
        return ["-l:libstdc++.so.6"]
    return []


def extension():
    with_cuda = want_cuda()
    defines = [("Py_LIMITED_API", "0x03090000")]
    cxx = ["-O3", "-std=c++17", "-fdiagnostics-color=always"]
    nvcc = ["-O3", "-std=c++17", "-lineinfo", "--expt-relaxed-constexpr"]
    kind = cpp_extension.CppExtension
    if with_cuda:
        defines.append(("BARACUDA_WITH_CUDA", None))
        kind = cpp_extension.CUDAExtension
    return kind(
        name="baracuda_torch._C",
        sources=sources(with_cuda),
        include_dirs=[KERNELS],
        define_macros=defines,
        extra_compile_args={"cxx": cxx, "nvcc": nvcc},
        extra_link_args=link_args(),
        py_limited_api=True,
    )


setup(
    name="baracuda_torch",
    version="0.1.0",
    description="Bespoke CUDA kernels for PyTorch as torch.ops.baracuda custom operators",
    packages=find_packages(include=["baracuda_torch", "baracuda_torch.*"]),
    ext_modules=[extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
    python_requires=">=3.9",
    install_requires=["torch"],
)
