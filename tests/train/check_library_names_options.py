#!/usr/bin/env python3
"""The library speaks in option names, the config layer in YAML keys (train/option_keys.h).

Fails when a string literal in the library layers below train/ names a VISSL/Largo YAML key
("MODEL.TRUNK.NAME", "OPTIMIZER.momentum", "DATA_PATHS"): such a message belongs in
train/option_keys.cpp's table, which maps the option the library names to its key.

    check_library_names_options.py REPO_ROOT
"""
import pathlib
import re
import sys

LAYERS = ["data", "kernels", "models", "optim", "parallel", "precision"]
# A dotted key under one of the config's sections, or an upper-case key with an underscore.
SECTIONS = ("MODEL", "DATA", "OPTIMIZER", "LOSS", "HOOKS", "DISTRIBUTED", "CHECKPOINT",
            "MACHINE", "METERS", "SLURM", "TRAINER", "TEST_ONLY", "TEST_MODEL")
DOTTED_KEY = re.compile(r"\b(?:%s)\.[A-Za-z_*{]" % "|".join(SECTIONS))
UPPER_KEY = re.compile(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]*[A-Z0-9]\b")
# Upper-case names that are not config keys: environment variables the library reads or
# names, and C/C++ macros.
NOT_KEYS = {"OMP_NUM_THREADS", "DNNL_MAX_CPU_ISA", "CUDA_VISIBLE_DEVICES", "LARGO_ALLOW_TF32",
            "TORCH_CHECK", "PYTORCH_CUDA_ALLOC_CONF", "SIZE_MAX", "INT64_MAX", "MALLOC_ARENA_MAX"}
STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')


def code_without_comments(text):
    """`text` with its // and /* */ comments blanked, string and character literals kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append("\n" * text.count("\n", i, end))  # keep the line numbers
            i = end
        elif text[i] in "\"'":
            quote, start = text[i], i
            i += 1
            while i < n and text[i] != quote and text[i] != "\n":
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append(text[start:i])
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def offending_literals(path):
    found = []
    for number, line in enumerate(code_without_comments(path.read_text()).splitlines(), 1):
        for literal in STRING.findall(line):
            names = set(DOTTED_KEY.findall(literal)) | (set(UPPER_KEY.findall(literal)) - NOT_KEYS)
            if names:
                found.append((number, literal))
    return found


def main():
    root = pathlib.Path(sys.argv[1])
    failures = []
    for layer in LAYERS:
        for folder in (root / "src" / "largo" / layer, root / "include" / "largo" / layer):
            for path in sorted(folder.rglob("*")):
                if path.suffix in (".cpp", ".h", ".cu", ".cuh"):
                    failures += [(path.relative_to(root), n, s) for n, s in offending_literals(path)]
    for path, number, literal in failures:
        print(f"{path}:{number}: names a YAML key: {literal}")
    if failures:
        print(f"{len(failures)} literal(s) in the library name YAML keys; name the option "
              "instead and map it in src/largo/train/option_keys.cpp")
        return 1
    print("the library layers name options, not YAML keys")
    return 0


if __name__ == "__main__":
    sys.exit(main())
