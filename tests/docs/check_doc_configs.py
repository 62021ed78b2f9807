#!/usr/bin/python3
"""Every ready config (configs/**/*.yaml) and every complete config shown in the docs
(a ```yaml block with a top-level `config:` key, in README.md and docs/*.md) must pass
`largo config`, i.e. parse and validate as written. And docs/config.md's count of VISSL's
keys that Largo lacks must be the number configs/vissl_keys.yaml holds.

`largo config` looks at a disk_folder's class folders (the class count sizes the head), so a
folder the docs name but this machine lacks (/datasets/imagenet/train) is stood in for by a
temporary ImageFolder tree of two class folders holding one small grey PNG each (a config whose
transforms leave the size to the images needs one to read); likewise a webdataset shard list
that names no file here by 4 temporary shards of two such PNGs (labels 0 and 1) each;
everything else is checked as written.

Usage: check_doc_configs.py SOURCE_DIR LARGO_BINARY
"""
import glob
import io
import pathlib
import re
import subprocess
import sys
import tarfile
import tempfile
import zlib
import struct

import yaml

source_dir, largo = pathlib.Path(sys.argv[1]), sys.argv[2]
configs = sorted(source_dir.glob("configs/**/*.yaml"))
# The defaults are the base and vissl_keys.yaml VISSL's other keys (tests/core/config_test.cpp
# loads it), not jobs.
configs = [c for c in configs if c.name not in ("defaults.yaml", "vissl_keys.yaml")]
blocks = []
for page in [source_dir / "README.md", *sorted((source_dir / "docs").glob("*.md"))]:
    for match in re.finditer(r"```yaml\n(.*?)```", page.read_text(), re.S):
        text = match.group(1)
        if re.search(r"^config:", text, re.M):
            blocks.append((f"{page.name} block at offset {match.start()}", text))



def write_grey_png(path, side=28):
    """A side x side 8-bit greyscale PNG, written with zlib alone."""
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(
            ">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
    rows = b"".join(b"\x00" + bytes([128] * side) for _ in range(side))
    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
                     + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def grey_png_bytes(side=28):
    with tempfile.TemporaryDirectory() as scratch:
        path = pathlib.Path(scratch) / "grey.png"
        write_grey_png(path, side)
        return path.read_bytes()


def stand_in_shards(prefix):
    """4 WebDataset shards PREFIX-00000{0..3}.tar of two grey PNGs (labels 0, 1); the list."""
    for j in range(4):
        with tarfile.open(f"{prefix}-{j:06d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for k in range(2):
                for name, data in ((f"{j}_{k}.png", grey_png_bytes()), (f"{j}_{k}.cls", str(k).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return f"{prefix}-{{000000..000003}}.tar"


def names_no_file(shard_list):
    """Whether a shard list's first brace expansion (or its glob) matches nothing here."""
    first = re.sub(r"\{([^.,}]*)(\.\.|,)[^}]*\}", r"\1", shard_list)
    return not glob.glob(first)


def stand_in_missing_folders(text, tmp):
    """The config text with each missing disk_folder DATA_PATHS entry replaced by a
    temporary tree of two class folders of one image each; None when nothing was missing."""
    document = yaml.safe_load(text)
    replaced = False
    for split in ("TRAIN", "TEST"):
        data = document.get("config", {}).get("DATA", {}).get(split, {})
        if "webdataset" in data.get("DATA_SOURCES", []):
            paths = data.get("DATA_PATHS", [])
            for i, shard_list in enumerate(paths):
                if names_no_file(shard_list):
                    paths[i] = stand_in_shards(str(pathlib.Path(tmp) / f"stand_in_{split.lower()}"))
                    replaced = True
            continue
        if "disk_folder" not in data.get("DATA_SOURCES", []):
            continue
        paths = data.get("DATA_PATHS", [])
        for i, folder in enumerate(paths):
            if not pathlib.Path(folder).exists():
                stand_in = pathlib.Path(tmp) / f"stand_in_{split.lower()}"
                for label in ("class_a", "class_b"):
                    (stand_in / label).mkdir(parents=True, exist_ok=True)
                    write_grey_png(stand_in / label / "0.png")
                paths[i] = str(stand_in)
                replaced = True
    return yaml.safe_dump(document) if replaced else None


def leaf_keys(node):
    """The keys a config can set under `node`, counted as core/vissl_keys.cpp walks them: a
    non-empty map holds keys, anything else (a value, a list, an empty map) is one."""
    if isinstance(node, dict) and node:
        return sum(leaf_keys(value) for value in node.values())
    return 1


vissl_keys = leaf_keys(
    yaml.safe_load((source_dir / "configs" / "vissl_keys.yaml").read_text())["config"])
stated = re.search(
    r"(\d+)\s+keys,\s+listed\s+with\s+VISSL's\s+defaults\s+in\s+`configs/vissl_keys\.yaml`",
    (source_dir / "docs" / "config.md").read_text())
count_ok = stated is not None and int(stated.group(1)) == vissl_keys
print(f"{'ok' if count_ok else 'FAILED'}: docs/config.md gives "
      f"{stated.group(1) if stated else 'no'} keys for configs/vissl_keys.yaml, which holds "
      f"{vissl_keys}")

failures = 0
with tempfile.TemporaryDirectory() as tmp:
    checks = []
    named = [(str(c.relative_to(source_dir)), c.read_text(), c) for c in configs]
    named += [(name, text, None) for name, text in blocks]
    for i, (name, text, original) in enumerate(named):
        stood_in = stand_in_missing_folders(text, tmp)
        if stood_in is None and original is not None:
            checks.append((name, original))
            continue
        path = pathlib.Path(tmp) / f"config{i}.yaml"
        path.write_text(stood_in if stood_in is not None else text)
        checks.append((name + (" (missing data folders stood in)" if stood_in else ""), path))
    for name, path in checks:
        result = subprocess.run([largo, "config", str(path)], capture_output=True, text=True)
        status = "ok" if result.returncode == 0 else "FAILED"
        print(f"{status}: {name}")
        if result.returncode != 0:
            print(result.stderr)
            failures += 1
print(f"{len(checks) - failures} passed, {failures} failed")
sys.exit(1 if failures or not checks or not count_ok else 0)
