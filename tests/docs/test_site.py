"""The documentation site builds with ``mkdocs build --strict``: every page in the nav, every
link between pages and every API reference entry (``docs/reference.md``, generated from the
package's docstrings by ``python -m tools.apiref``) resolves, so a renamed module or a moved
page fails here, not on a reader's screen."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_docs_site_builds_strictly(tmp_path: Path) -> None:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=240, env=env,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    reference = (tmp_path / "site" / "reference" / "index.html").read_text()
    for name in ("pi_durable_lmdb.LmdbStorage.commit", "pi_durable_lmdb.errors.CorruptRecordError"):
        assert f'id="{name}"' in reference, name
    # What a host meets: storage.log, storage.projections and a projection's tables, the commits
    # and writes it folds, the transparency log's signer, the metrics; each module by its __all__.
    modules = {
        "log.writelog": ["WriteLog", "seq_key"],
        "log.records": ["Commit", "Write", "ConversationWrite", "EntryWrite", "TaskWrite",
                        "SubmissionWrite", "DocumentCreateWrite", "DocumentCopyWrite",
                        "DocumentChangeWrite", "DocumentRetireWrite", "BaseContent", "DeltaContent"],
        "projections.user": ["Projection", "UserProjections", "Tables", "CoreView"],
        "projections.typedrows": ["TypedTable", "KeyCodec"],
        "tlog": ["generate_signer", "verify_inclusion", "verify_checkpoint"],
        "metrics": ["register", "register_path"],
    }
    for module, names in modules.items():
        offered = importlib.import_module(f"pi_durable_lmdb.{module}").__all__
        for name in names:
            assert name in offered, (module, name)
            assert f'id="pi_durable_lmdb.{module}.{name}"' in reference, (module, name)
    for page in ("architecture", "reliability", "distributed", "benchmarks", "getting-started", "troubleshooting"):
        assert (tmp_path / "site" / page / "index.html").is_file(), page
    changelog = (tmp_path / "site" / "changelog" / "index.html").read_text()
    first = next(line for line in (ROOT / "CHANGELOG.md").read_text().splitlines() if line.startswith("## "))
    assert first[3:].strip("[]") in changelog, "the changelog page includes CHANGELOG.md"
