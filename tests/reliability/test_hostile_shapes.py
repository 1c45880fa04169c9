"""Hostile problems files fail fast with a short message: YAML alias bombs, and grids of absurd size."""

import time

import pytest

from autoflash.shapes import MAX_PROBLEMS, ShapesError, load_problems

# Nine levels of nine aliases: 9**9 (387 million) leaves from a file of a few hundred bytes.
BOMB = "".join(f"{chr(97 + i)}: &{chr(97 + i)} [{', '.join([f'*{chr(96 + i)}' if i else 'x'] * 9)}]\n"
               for i in range(9))


def refused(tmp_path, text, match):
    path = tmp_path / "shapes.yaml"
    path.write_text(text)
    started = time.monotonic()
    with pytest.raises(ShapesError, match=match) as error:
        load_problems(path)
    # Seconds, not the minutes (and gigabytes) an expanded bomb takes; generous for a loaded 2-core CI machine.
    assert time.monotonic() - started < 10, "a hostile file must fail fast"
    message = str(error.value)
    assert len(message) < 500 and "\n" not in message, f"{len(message)} characters"
    return message


@pytest.mark.parametrize("use", ["problems:\n  - {batch: 1, heads_q: 2, seqlen_q: *i, head_dim: 64}\n",
                                 "problems:\n  - {batch: 1, heads_q: 2, seqlen_q: [*i], head_dim: 64}\n",
                                 "problems:\n  - {batch: 1, heads_q: 2, seqlen_q: 8, head_dim: 64, dtype: {x: *i}}\n",
                                 "problems: [*i]\n",
                                 "problems:\n  - *i\n"])
def test_an_alias_bomb_fails_fast_with_a_short_message(tmp_path, use):
    assert len(BOMB) < 400
    refused(tmp_path, BOMB + use, r"problems\[0\]: (field '\w+' must be a value or a flat list|expected a mapping)")


def test_a_grid_of_absurd_size_is_refused_with_its_size(tmp_path):
    twenty = "[" + ", ".join(str(n) for n in range(16, 36)) + "]"  # 20 values: 20**5 = 3.2 million problems
    text = (f"problems:\n  - {{batch: {twenty}, heads_q: {twenty}, seqlen_q: {twenty}, seqlen_k: {twenty},"
            f" head_dim: {twenty}}}\n")
    message = refused(tmp_path, text, r"problems\[0\]: the grid stands for 3,200,000 problems")
    assert f"{MAX_PROBLEMS:,}" in message


def test_grids_that_are_each_allowed_but_together_too_many_are_refused(tmp_path):
    entry = "  - {batch: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], heads_q: 1, seqlen_q: %s, head_dim: 64}\n"
    many = "[" + ", ".join(str(n) for n in range(1, 8001)) + "]"  # 10 x 8,000 = 80,000 problems an entry
    message = refused(tmp_path, "problems:\n" + entry % many + entry % many, "stand for 160,000 problems")
    assert "split the file" in message


def test_a_long_value_is_echoed_cut_short(tmp_path):
    message = refused(tmp_path, "problems:\n  - {batch: 1, heads_q: 2, seqlen_q: 8, head_dim: 64, dtype: %s}\n"
                      % ("y" * 100_000), "field 'dtype' must be one of")
    assert message.endswith("characters)")
