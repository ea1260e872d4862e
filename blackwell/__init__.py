"""The Blackwell kernels (sm_100a: tcgen05, the accumulator in tensor memory), one idea per file.

Each ``matmul_vN.py`` is numbered by the Hopper version of the same idea, ``matmul_vN.py`` at the
repository's top level, whose ``matmul`` runs it on a Blackwell GPU. Hopper's v6 (the swizzled
store) and v7 (clusters) have no Blackwell kernel. Every schedule is built for sm_100a and
protocol-checked in CI (tests/test_protocol.py), never run: there was no Blackwell GPU.
docs/blackwell.md says what each one changes against the Hopper page of its idea.
"""
