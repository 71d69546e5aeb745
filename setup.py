"""Build of baracuda_torch's one extension module, baracuda_torch._C (the
package's metadata and version are in pyproject.toml).

CPU kernels are always built. CUDA kernels are built when torch was built
with CUDA and nvcc is found; BARACUDA_WITH_CUDA=0/1 overrides the detection
(1 fails loudly if CUDA cannot be built). TORCH_CUDA_ARCH_LIST picks the GPU
architectures and MAX_JOBS the parallel compile jobs (both read by
torch.utils.cpp_extension); ninja is used when installed.
"""

import glob
import os
import sys
import sysconfig

import torch
from setuptools import setup
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


def headers() -> list:
    """Every header under kernels/: setuptools relinks the extension only when
    a file it depends on is newer than the built library, and ninja then
    recompiles just the objects whose headers changed."""
    files = glob.glob(os.path.join(KERNELS, "**", "*.h"), recursive=True)
    files += glob.glob(os.path.join(KERNELS, "**", "*.cuh"), recursive=True)
    return sorted(os.path.relpath(f, ROOT) for f in files)


def link_args() -> list:
    # Bind the C++ runtime to the shared libstdc++ that torch itself uses.
    # Some toolchains put only libstdc++.a on their search path, so a plain
    # -lstdc++ links it statically: the extension then carries a second,
    # never-initialised copy of the iostream/locale machinery, and the first
    # error message that formats a number crashes. Naming the shared object
    # resolves every C++ runtime symbol before the archive is consulted.
    if sys.platform.startswith("linux"):
        return ["-l:libstdc++.so.6", *openmp_flags()]
    return []


def openmp_flags() -> list:
    """-fopenmp where torch's own CPU threads are OpenMP's (at::parallel_for
    is a header template whose parallel region compiles to one thread
    without it). The OpenMP runtime it links is the one torch already loaded.
    """
    if sys.platform.startswith("linux") and "OpenMP" in torch.__config__.parallel_info():
        return ["-fopenmp"]
    return []


def cuda_arch_flags() -> list:
    """nvcc -gencode flags for TORCH_CUDA_ARCH_LIST (or the visible GPUs).

    Compute capability 9.0 is built as sm_90a, the Hopper target whose
    warpgroup MMA instructions the attention kernel uses (sm_90a machine code
    runs on every 9.0 GPU). An empty list leaves the choice to torch.
    """
    arch_list = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if not arch_list:
        if not torch.cuda.is_available():
            return []
        capabilities = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
        arch_list = ";".join(f"{major}.{minor}" for major, minor in sorted(capabilities))
    flags = []
    for entry in arch_list.replace(" ", ";").split(";"):
        if not entry:
            continue
        number, ptx = (entry[: -len("+PTX")], True) if entry.endswith("+PTX") else (entry, False)
        digits = number.replace(".", "")
        if not digits.rstrip("af").isdigit():
            return []  # a named architecture ("Hopper", ...): torch knows those
        machine = "90a" if digits == "90" else digits
        flags.append(f"-gencode=arch=compute_{machine},code=sm_{machine}")
        if ptx:  # portable PTX, for GPUs newer than the list
            flags.append(f"-gencode=arch=compute_{digits},code=compute_{digits}")
    return flags


def extension():
    with_cuda = want_cuda()
    defines = [("Py_LIMITED_API", "0x03090000")]
    cxx = ["-O3", "-std=c++17", "-fdiagnostics-color=always", *openmp_flags()]
    nvcc = ["-O3", "-std=c++17", "-lineinfo", "--expt-relaxed-constexpr"]
    kind = cpp_extension.CppExtension
    if with_cuda:
        defines.append(("BARACUDA_WITH_CUDA", None))
        kind = cpp_extension.CUDAExtension
        arch_flags = cuda_arch_flags()
        nvcc += arch_flags
        if any("sm_90a" in f for f in arch_flags):
            defines.append(("BARACUDA_SM90A", None))
    return kind(
        name="baracuda_torch._C",
        sources=sources(with_cuda),
        depends=headers(),
        include_dirs=[KERNELS],
        define_macros=defines,
        extra_compile_args={"cxx": cxx, "nvcc": nvcc},
        extra_link_args=link_args(),
        py_limited_api=True,
    )


class BuildExtension(cpp_extension.BuildExtension):
    """torch's build_ext, compiling editable installs in build/ as well.

    setuptools points an editable install's build at a fresh temporary
    directory, so every `pip install -e .` would recompile everything; in the
    build directory of `setup.py build_ext` ninja recompiles only what changed.
    """

    def finalize_options(self):
        super().finalize_options()
        if getattr(self, "editable_mode", False):
            tag = f"{sysconfig.get_platform()}-{sys.implementation.cache_tag}"
            self.build_temp = os.path.join(ROOT, "build", f"temp.{tag}")


setup(
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExtension},
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
)
