"""Constrained decoding: per-request grammars that mask the next-token logits.

`spec` holds the plain data a request carries (`ToolConstraint`, no torch, no xgrammar): it crosses
the process boundary inside `engine.protocol.Extend`. `base.TokenGrammar` is the per-request state
the sampler (and, later, speculative-draft verification) talks to; `xgrammar_backend` compiles a
constraint into one with xgrammar.
"""
