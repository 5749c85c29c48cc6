"""What a result row says about where it was measured."""

from __future__ import annotations


def test_cuda_version_is_read_without_importing_torch():
    import subprocess
    import sys

    from actors.environment import parse_torch_cuda_version

    assert parse_torch_cuda_version("__version__ = '2.11.0+cu130'\ncuda: Optional[str] = '13.0'\n") == "13.0"
    assert parse_torch_cuda_version("cuda = '12.4'\nhip = None\n") == "12.4"
    assert parse_torch_cuda_version("cuda: Optional[str] = None\n") is None
    # The same answer as torch itself, and torch stays unimported.
    probe = ("import sys; from actors.environment import torch_cuda_version as f; v = f(); "
             "assert 'torch' not in sys.modules; import torch; assert v == torch.version.cuda, (v, torch.version.cuda)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
