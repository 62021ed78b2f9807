#!/usr/bin/env python3
"""How much of VISSL's config tree `largo config` loads, and why the rest is refused.

Runs `largo config config=<name>` for every YAML file under VISSL's configs/config (as VISSL's
users name them), with LARGO_CONFIG_ROOT at that tree and a dataset catalog in which every
dataset name that VISSL's catalog lists or a config names points at a tiny dataset of the
right kind (a file list for *_filelist names and names a split reads as disk_filelist, else an
image folder), so that configs naming data resolve through the catalog as they would on a
machine with the data. A fragment (a file in a folder whose parent folder holds configs: a
Hydra config group such as models/, transforms/, datasets/ or optimization/, whose options
VISSL's users add to one of those configs on the command line) is run as
`config=<base> +config/<its folder>=<its name>` with the base configs of the folder above it,
up to three, then alone (some such files are whole configs), and counts as loading when one
of those runs loads. Nothing is overridden. Prints the share that
loads and the most frequent refusals, by the key or phrase they name.

    git clone https://github.com/facebookresearch/vissl /tmp/vissl
    $LARGO_PYTHON scripts/vissl_config_tree_report.py /tmp/vissl/configs build/largo [--jobs 2]

--only REGEX runs the configs whose name matches (e.g. after a change, those it is about; the
share is then of those), and --each prints every config's outcome.
"""
import argparse
import collections
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
from PIL import Image


def tiny_folder(root):
    for label in ("a", "b"):
        os.makedirs(os.path.join(root, label), exist_ok=True)
        Image.new("RGB", (32, 32), (10, 20, 30)).save(os.path.join(root, label, "x.png"))
    return root


def tiny_filelist(root, folder):
    os.makedirs(root, exist_ok=True)
    images = os.path.join(root, "images.npy")
    labels = os.path.join(root, "labels.npy")
    np.save(images, np.array([os.path.join(folder, "a", "x.png"), os.path.join(folder, "b", "x.png")]))
    np.save(labels, np.array([0, 1], dtype=np.int64))
    return images, labels


def dataset_names_in_configs(config_dir):
    """Every DATASET_NAMES entry of the tree, and those a split reads as disk_filelist."""
    names, filelists = set(), set()
    for d, _, files in os.walk(config_dir):
        for f in files:
            if f.endswith(".yaml"):
                with open(os.path.join(d, f), errors="replace") as text:
                    # A split's keys sit together: DATA_SOURCES a few lines from DATASET_NAMES.
                    for split in re.split(r"\n\s*(?:TRAIN|TEST):", text.read()):
                        for match in re.finditer(r"DATASET_NAMES:\s*\[([^\]]*)\]", split):
                            found = {n.strip(" '\"") for n in match.group(1).split(",") if n.strip()}
                            names |= found
                            if re.search(r"DATA_SOURCES:\s*\[\s*disk_filelist", split):
                                filelists |= found
    return names, filelists


def catalog_for(vissl_catalog, config_dir, scratch):
    folder = tiny_folder(os.path.join(scratch, "folder"))
    images, labels = tiny_filelist(os.path.join(scratch, "filelist"), folder)
    in_configs, filelists = dataset_names_in_configs(config_dir)
    with open(vissl_catalog) as f:
        names = set(json.load(f).keys()) | in_configs
    entry = lambda name: (
        [images, labels] if "filelist" in name or name in filelists else [folder, "<unused>"])
    catalog = {name: {"train": entry(name), "val": entry(name)} for name in names}
    path = os.path.join(scratch, "dataset_catalog.json")
    with open(path, "w") as f:
        json.dump(catalog, f)
    return path


def reason(output):
    line = next((l for l in output.splitlines() if l.startswith("largo: ")), output.strip()[-200:])
    key = re.search(r"config key ([A-Za-z0-9_.\[\]]+)", line)
    if key:
        return "config key " + re.sub(r"\[\d+\]", "[i]", key.group(1))
    return re.sub(r"\d+", "N", line[:120])


def run_one(largo, arguments, env):
    result = subprocess.run(
        [largo, "config"] + arguments, env=env, capture_output=True, text=True, timeout=120)
    return result.returncode, result.stdout + result.stderr


def bases_of(name, names):
    """The base configs a fragment composes with: the files of its folder's parent folder."""
    parent = os.path.dirname(os.path.dirname(name))
    return [n for n in names if os.path.dirname(n) == parent][:3]


def is_fragment(name, names):
    return os.path.dirname(name) != "" and bool(bases_of(name, names))


def run(largo, name, names, env):
    outcome = None
    if is_fragment(name, names):
        group, option = os.path.dirname(name), os.path.basename(name)
        for base in bases_of(name, names):
            code, output = run_one(largo, ["config=" + base, f"+config/{group}={option}"], env)
            outcome = outcome or (code, output)
            if code == 0:
                return name, code, output
    code, output = run_one(largo, ["config=" + name], env)
    return (name,) + (outcome if code != 0 and outcome else (code, output))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("configs", help="VISSL's configs/ folder (it holds config/)")
    parser.add_argument("largo", help="the largo program")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", help="run only the configs whose name matches this regex")
    parser.add_argument("--each", action="store_true", help="print every config's outcome")
    args = parser.parse_args()
    config_dir = os.path.join(args.configs, "config")
    names = sorted(
        os.path.relpath(os.path.join(d, f), config_dir)[: -len(".yaml")]
        for d, _, files in os.walk(config_dir) for f in files if f.endswith(".yaml"))
    with tempfile.TemporaryDirectory() as scratch:
        env = dict(os.environ, LARGO_CONFIG_ROOT=args.configs,
                   VISSL_DATASET_CATALOG_PATH=catalog_for(
                       os.path.join(config_dir, "dataset_catalog.json"), config_dir, scratch))
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            chosen = [n for n in names if not args.only or re.search(args.only, n)]
            results = list(pool.map(lambda n: run(args.largo, n, names, env), chosen))
    if args.each:
        for name, code, output in results:
            print(f"{name}: {'loads' if code == 0 else reason(output)}")
    loaded = [name for name, code, _ in results if code == 0]
    crashed = [name for name, code, _ in results if code not in (0, 2)]
    reasons = collections.Counter(reason(out) for _, code, out in results if code == 2)
    fragments = [name for name, _, _ in results if is_fragment(name, names)]
    print(f"{len(loaded)} of {len(results)} configs load ({100.0 * len(loaded) / len(results):.1f} %); "
          f"{sum(reasons.values())} refused by a config error; {len(crashed)} other failures")
    print(f"of them {len(fragments)} fragments, run with a base config of their parent folder: "
          f"{sum(1 for name in loaded if is_fragment(name, names))} load")
    for text, count in reasons.most_common(25):
        print(f"{count:5d}  {text}")
    for name in crashed[:10]:
        print("other failure:", name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
