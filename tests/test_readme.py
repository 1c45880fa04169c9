"""The README's Python examples run as written, top to bottom as a reader takes them (under Triton's interpreter,
on small CPU tensors named as the README names them): an example that drifts from the API fails here, not in a
user's hands. Left out: those that need what CI has not (a model's weights, several GPUs, an exported package)."""

import linecache
import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parent.parent / "README.md"
NEEDS_ELSEWHERE = ("from_pretrained", "torch.distributed", "from my_attention")


def examples() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), re.S | re.M)


def tensors(example: str, gen: torch.Generator) -> dict:
    """The example's tensors, small: (1, 2, 40, 16) fp32 queries, keys and values; packed sequences of 3, 0 and 7
    tokens (attention_varlen's layout); a decode step of 3 sequences against a cache of 16-token pages, in any
    order (attention_with_kvcache's)."""
    def randn(*shape, grad=False):
        return torch.randn(*shape, generator=gen).requires_grad_(grad)
    if "attention_varlen" in example:
        cu_seqlens = torch.tensor([0, 3, 3, 10], dtype=torch.int32)
        return dict(q=randn(10, 2, 16), k=randn(10, 2, 16), v=randn(10, 2, 16), cu_seqlens_q=cu_seqlens,
                    cu_seqlens_k=cu_seqlens, max_seqlen_q=7, max_seqlen_k=7)
    if "attention_with_kvcache" in example:
        return dict(q=randn(3, 1, 2, 16), k_cache=randn(3, 16, 2, 16), v_cache=randn(3, 16, 2, 16),
                    lengths=torch.tensor([3, 0, 7], dtype=torch.int32),
                    table=torch.tensor([[2], [0], [1]], dtype=torch.int32), k_new=randn(3, 1, 2, 16),
                    v_new=randn(3, 1, 2, 16))
    return dict(q=randn(1, 2, 40, 16, grad=True), k=randn(1, 2, 40, 16, grad=True), v=randn(1, 2, 40, 16, grad=True),
                buffer=torch.empty(1, 2, 40, 16), slopes=torch.tensor([0.5, 0.25]),
                document_id=torch.arange(40, dtype=torch.int32) // 13)


def test_the_readme_examples_run_as_written():
    runnable = [(i, e) for i, e in enumerate(examples(), 1) if not any(n in e for n in NEEDS_ELSEWHERE)]
    assert len(runnable) >= 7, [e[:60] for e in examples()]
    gen, scope = torch.Generator().manual_seed(0), {"torch": torch}
    for number, example in runnable:
        scope.update(tensors(example, gen), out=None)
        source, name = "import autoflash\n" + example, f"<README.md's python example {number}>"
        linecache.cache[name] = (len(source), None, source.splitlines(True), name)  # (a mod's source is read back)
        exec(compile(source, name, "exec"), scope)
        out = scope["out"]
        assert out is None or torch.isfinite(out).all(), f"example {number}: an output that is not finite"


def test_the_readme_commands_name_options_that_exist():
    """Every `autoflash <command> --option` the README writes is an option of that command."""
    from autoflash.cli import main

    said = re.findall(r"(?:python -m )?autoflash (tune|show|bench|export|merge)\b([^`\n]*)", README.read_text())
    assert len(said) >= 10, said
    unknown = set()
    for command, rest in said:
        options = {opt for param in main.commands[command].params for opt in param.opts}
        unknown |= {f"{command} {opt}" for opt in re.findall(r"(?<![\w-])--[a-z][a-z-]*", rest) if opt not in options}
    assert not unknown, f"the README names options these commands do not have: {sorted(unknown)}"
