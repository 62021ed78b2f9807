#!/usr/bin/env python3
"""The part of scripts/vissl_config_tree_report.py that concerns the in-memory datasets.

Runs `largo config` (as the full report runs it: LARGO_CONFIG_ROOT at VISSL's configs/, a
catalog of tiny datasets) on the configs whose YAML names a torchvision dataset
(DATA_SOURCES torchvision_dataset, or DATASET_NAMES CIFAR*/STL10/SVHN/MNIST), or whose base
config does (a fragment composed with it, as the report composes it), and prints each one's
outcome: minutes instead of the full report's half hour of CPU.

  python3 scripts/vissl_in_memory_configs.py /tmp/vissl_tree/configs build/largo
"""
import argparse
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vissl_config_tree_report as report  # noqa: E402

PATTERN = re.compile(r"torchvision_dataset|DATASET_NAMES:.*(cifar|stl10|svhn|mnist)", re.I)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("configs", help="VISSL's configs/ folder (it holds config/)")
    parser.add_argument("largo", help="the largo program")
    args = parser.parse_args()
    config_dir = os.path.join(args.configs, "config")
    names = sorted(
        os.path.relpath(os.path.join(d, f), config_dir)[: -len(".yaml")]
        for d, _, files in os.walk(config_dir) for f in files if f.endswith(".yaml"))
    names_dataset = {n for n in names
                     if PATTERN.search(open(os.path.join(config_dir, n + ".yaml"),
                                            errors="replace").read())}
    # A fragment (models/...) counts with the base configs it is composed with.
    chosen = [n for n in names if n in names_dataset
              or (report.is_fragment(n) and set(report.bases_of(n, names)) & names_dataset)]
    with tempfile.TemporaryDirectory() as scratch:
        env = dict(os.environ, LARGO_CONFIG_ROOT=args.configs,
                   VISSL_DATASET_CATALOG_PATH=report.catalog_for(
                       os.path.join(config_dir, "dataset_catalog.json"), config_dir, scratch))
        results = [report.run(args.largo, name, names, env) for name in chosen]
    for name, code, output in results:
        print(f"{'loads  ' if code == 0 else 'refused'}  {name}"
              + ("" if code == 0 else f"\n         {report.reason(output)}: "
                 + next((l for l in output.splitlines() if l.startswith('largo: ')), '')[:300]))
    loaded = sum(1 for _, code, _ in results if code == 0)
    print(f"{loaded} of {len(results)} configs load")
    return 0


if __name__ == "__main__":
    sys.exit(main())
