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
        text = (ROOT / PACKAGE / m.path).read_text()
        assert text.count(m.old) == 1, f"{m.name}: its text is in {m.path} {text.count(m.old)} times"
        assert m.old != m.new, m.name
        compile(text.replace(m.old, m.new), m.path, "exec")  # the planted bug is still Python


def test_a_planted_bug_changes_only_the_copy(tmp_path):
    m = MUTATIONS[0]
    copy_repo(tmp_path)
    apply(m, tmp_path)
    assert m.old not in (tmp_path / PACKAGE / m.path).read_text()
    assert m.old in (ROOT / PACKAGE / m.path).read_text()
    compile((tmp_path / PACKAGE / m.path).read_text(), m.path, "exec")
