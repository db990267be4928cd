"""The Numba layer: compiled kernels over plain arrays, with no policy and no validation.

`tree` (sum tree and min trees in one node array), `minselect` (the k lowest keys), `rng` (xoshiro256++ inside
kernels, and permutations drawn from it), `buffer` (one call's bookkeeping for add / sample / update), `sampler`
and `mixing` (the same for `PrioritizedSampler` and `MixtureSampler`), `prompts` and `calendar` (a batch's
draws and a feedback call's writes of `PromptSampler`, and its calendar of staleness halvings). The classes in
the package above own the arrays and check every input before a kernel sees it. Strategy rules are not here:
each strategy part keeps its own kernel next to its Python form (`replayloader.strategies`).

Kernels are compiled with ``cache=True``: the first call in a fresh environment compiles them (seconds), later
processes load them from the on-disk cache (`bench/first_call.py` measures both).
"""
