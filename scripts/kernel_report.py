#!/usr/bin/env python3
"""Registers, spills and machine-code size of our CUDA kernels, without a GPU.

Compiles one kernel module (crates/backend/src/cuda/kernels/<module>.cu, with
common.cuh in front, as the engine does) to an sm_90a cubin with NVRTC and
disassembles it with nvdisasm. For each kernel whose name matches a pattern it
prints the registers, stack and spills ptxas reports, the instruction count,
and the instructions of its longest backward-branch loop (the main loop of a
GEMV), by opcode. Run it through scripts/kernel-report.sh, which provides both
libraries from their pip wheels.

  kernel_report.py NVRTC_LIB_DIR NVDISASM MODULE [REGEX ...] [--arch sm_90a] [--loop] [--sass] [-D NAME=VALUE ...]
"""
import argparse
import collections
import ctypes
import glob
import os
import re
import subprocess
import sys
import tempfile

KERNELS = os.path.join(os.path.dirname(__file__), "..", "crates", "backend", "src", "cuda", "kernels")
# Each module's files in order (compile.rs MODULES); others are MODULE.cu alone.
PARTS = {
    "attention": ["wgmma.cuh", "quantize_x8.cuh", "attention.cu", "attention_rows_mma.cu"],
    "quant": [
        "rope_kv.cuh",
        "quantize_x8.cuh",
        "quant.cu",
        "gemv_tile.cu",
        "gemv_tile_b32.cu",
        "decode_layers.cu",
        "decode_window.cu",
        "mlp_fused.cu",
    ],
}


def compile_cubin(lib_dir, module, arch, defines=()):
    nvrtc = ctypes.CDLL(sorted(glob.glob(os.path.join(lib_dir, "libnvrtc.so*")))[0])
    with open(os.path.join(KERNELS, "common.cuh")) as f:
        src = f.read() + "\n"
    # As compile.rs MODULES joins them.
    for part in PARTS.get(module, [module + ".cu"]):
        with open(os.path.join(KERNELS, part)) as f:
            src += f.read()
    prog = ctypes.c_void_p()
    if nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), f"{module}.cu".encode(), 0, None, None):
        sys.exit("nvrtcCreateProgram failed")
    opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17", b"--ptxas-options=-v"]
    opts += [f"-D{d}".encode() for d in defines]
    status = nvrtc.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    if status:
        sys.exit(log.value.decode())
    nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    cubin = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetCUBIN(prog, cubin)
    return cubin.raw, log.value.decode()


def ptxas_info(log):
    """Kernel name -> (registers, stack bytes, spill stores, spill loads)."""
    info, name = {}, None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            name = m.group(1)
            info[name] = [0, 0, 0, 0]
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and name:
            info[name][1:] = [int(g) for g in m.groups()]
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            info[name][0] = int(m.group(1))
    return info


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("lib_dir")
    p.add_argument("nvdisasm")
    p.add_argument("module")
    p.add_argument("patterns", nargs="*", default=[".*"])
    p.add_argument("--arch", default="sm_90a")
    p.add_argument("--loop", action="store_true", help="also list the main loop's opcodes")
    p.add_argument("-D", dest="defines", action="append", default=[], help="a preprocessor definition, NAME or NAME=VALUE")
    p.add_argument("--sass", action="store_true", help="also print the main loop's instructions")
    a = p.parse_args()
    cubin, log = compile_cubin(a.lib_dir, a.module, a.arch, a.defines)
    info = ptxas_info(log)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([a.nvdisasm, "-c", f.name], capture_output=True, text=True, check=True).stdout
    print(f"{'kernel':<28} {'regs':>4} {'stack':>5} {'spill st/ld':>11} {'instrs':>6} {'loop':>5}")
    for part in re.split(r"\n\s*\.text\.", sass)[1:]:
        name = part.split(":")[0].strip()
        if not any(re.fullmatch(pat, name) for pat in a.patterns):
            continue
        lines = part.splitlines()
        ops = [(i, m.group(2)) for i, l in enumerate(lines)
               if (m := re.search(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", l))]
        labels = {l.strip().rstrip(":"): i for i, l in enumerate(lines) if re.match(r"^\.L_x_\d+:", l.strip())}
        # The longest loop: a branch back to a label above it.
        loop = (0, 0)
        for i, l in enumerate(lines):
            m = re.search(r"BRA\s+`\((\.L_x_\d+)\)", l)
            if m and labels.get(m.group(1), i) < i and i - labels[m.group(1)] > loop[1] - loop[0]:
                loop = (labels[m.group(1)], i)
        body = [op for i, op in ops if loop[0] < i <= loop[1]]
        r = info.get(name, [0, 0, 0, 0])
        print(f"{name:<28} {r[0]:>4} {r[1]:>5} {f'{r[2]}/{r[3]}':>11} {len(ops):>6} {len(body):>5}")
        if a.loop and body:
            counts = collections.Counter(op.split(".")[0] for op in body)
            print("    " + ", ".join(f"{op} {n}" for op, n in counts.most_common()))
        if a.sass:
            print("\n".join(l for l in lines[loop[0] : loop[1] + 1] if "/*" in l))


if __name__ == "__main__":
    main()
