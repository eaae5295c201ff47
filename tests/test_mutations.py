"""The mutation check's planted bugs still apply to the code (``python -m tests.model.mutations``).

The check itself (each bug planted, CI's checker run against it: minutes) runs beside CI; this
keeps its set from rotting silently: a refactor that removes a mutation's text fails here, and
the mutation is then updated to the new code (docs/guarantees.md, "The mutation check").
"""

from __future__ import annotations

from tests.model.mutations import MUTATIONS, PACKAGE, ROOT, apply, copy_repo


def test_every_planted_bug_is_found_exactly_once_in_its_file():
    assert len(MUTATIONS) >= 16
    assert len({m.name for m in MUTATIONS}) == len(MUTATIONS)
    for m in MUTATIONS:
        for path, old, new in m.parts():  # a slip over two places (``more``): each found once
            text = (ROOT / PACKAGE / path).read_text()
            assert text.count(old) == 1, f"{m.name}: its text is in {path} {text.count(old)} times"
            assert old != new, m.name
            compile(text.replace(old, new), path, "exec")  # the planted bug is still Python


def test_a_planted_bug_changes_only_the_copy(tmp_path):
    m = MUTATIONS[0]
    copy_repo(tmp_path)
    apply(m, tmp_path)
    assert m.old not in (tmp_path / PACKAGE / m.path).read_text()
    assert m.old in (ROOT / PACKAGE / m.path).read_text()
    compile((tmp_path / PACKAGE / m.path).read_text(), m.path, "exec")
