#!/usr/bin/python3
"""Every ready config (configs/**/*.yaml) and every complete config shown in the docs
(a ```yaml block with a top-level `config:` key, in README.md and docs/*.md) must pass
`largo config`, i.e. parse and validate as written.

Usage: check_doc_configs.py SOURCE_DIR LARGO_BINARY
"""
import pathlib
import re
import subprocess
import sys
import tempfile

source_dir, largo = pathlib.Path(sys.argv[1]), sys.argv[2]
configs = sorted(source_dir.glob("configs/**/*.yaml"))
configs = [c for c in configs if c.name != "defaults.yaml"]  # defaults are the base, not a job
blocks = []
for page in [source_dir / "README.md", *sorted((source_dir / "docs").glob("*.md"))]:
    for match in re.finditer(r"```yaml\n(.*?)```", page.read_text(), re.S):
        text = match.group(1)
        if re.search(r"^config:", text, re.M):
            blocks.append((f"{page.name} block at offset {match.start()}", text))

failures = 0
with tempfile.TemporaryDirectory() as tmp:
    checks = [(str(c.relative_to(source_dir)), c) for c in configs]
    for i, (name, text) in enumerate(blocks):
        path = pathlib.Path(tmp) / f"block{i}.yaml"
        path.write_text(text)
        checks.append((name, path))
    for name, path in checks:
        result = subprocess.run([largo, "config", str(path)], capture_output=True, text=True)
        status = "ok" if result.returncode == 0 else "FAILED"
        print(f"{status}: {name}")
        if result.returncode != 0:
            print(result.stderr)
            failures += 1
print(f"{len(checks) - failures} passed, {failures} failed")
sys.exit(1 if failures or not checks else 0)
