"""The README cannot drift from code that runs: every Python block in it is a verbatim
excerpt (indentation aside) of one of examples/*.py, which test_examples.py runs against
the real services, and every example compiles."""

import re
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]
README = (HERE / "README.md").read_text()
EXAMPLES = sorted((HERE / "examples").glob("*.py"))
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)


def lines(text):
    return [ln.strip() for ln in text.splitlines() if ln.strip()]


def test_there_are_blocks_and_examples():
    assert len(BLOCKS) >= 4 and len(EXAMPLES) >= 3


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: lines(b)[0][:40])
def test_python_block_is_an_excerpt_of_an_example(block):
    want = lines(block)
    for path in EXAMPLES:
        have = lines(path.read_text())
        if any(have[i:i + len(want)] == want for i in range(len(have))):
            return
    pytest.fail(f"README block not found in examples/: {block}")


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_compiles(path):
    compile(path.read_text(), str(path), "exec")


def test_linked_files_exist():
    for link in re.findall(r"\]\(([^)#:]+)\)", README):
        assert (HERE / link).exists(), link
