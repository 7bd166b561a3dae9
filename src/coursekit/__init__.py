"""coursekit: the library behind a hands-on course on distributed LLM training.

Module map (folders mirror the curriculum):
  dist, launch, models, data, train, strategies/   the runtime every lab stands on
  memory/ (pure Python), flops, measure/, comm/    Module 1: memory math and collectives
  strategies/zero.py                                Module 2: DeepSpeed ZeRO
"""
__version__ = "0.1.0"
