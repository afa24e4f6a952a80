import os
import subprocess
import sys

import pytest

from krill.allocator import tune_heap


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_glibc_accepts_the_heap_thresholds():
    assert tune_heap() is True


def test_the_heap_tuning_can_be_turned_off():
    code = "from krill.allocator import tune_heap; print(tune_heap())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "KRILL_MALLOC_TUNING": "0"})
    assert out.stdout.strip() == "False"
