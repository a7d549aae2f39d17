"""The reference client's token count: one per marker, wherever the chunks of the stream split it."""

from __future__ import annotations

import pytest

from batchscope.testkit.reference_client import COMPLETION_TEXT, EVENT, MarkerCounter

STREAM = (b'data: {"choices":[{"text":"a"}]}\n\ndata: {"choices":[{"text":"b"}]}\n\n'
          b'data: {"choices":[],"usage":{}}\n\ndata: [DONE]\n\n')


@pytest.mark.parametrize("size", [1, 2, 3, 7, 8, 9, 64, len(STREAM)])
def test_markers_split_across_chunks_count_once(size):
    for marker, expected in ((COMPLETION_TEXT, 2), (EVENT, 3)):
        counter = MarkerCounter(marker)
        assert sum(counter.feed(STREAM[i:i + size]) for i in range(0, len(STREAM), size)) == expected


def test_a_one_byte_marker_keeps_no_tail():
    counter = MarkerCounter(b"x")
    assert counter.feed(b"xx") == 2 and counter.feed(b"x") == 1
