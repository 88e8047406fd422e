"""The heuristic FunSearch found for Weibull sets (Romera-Paredes et al., Nature 2023,
Supplementary Fig. C.14; DeepMind, Apache-2.0), for checking this task's semantics."""


def priority(item, bins):
    max_bin_cap = max(bins)
    score = (bins - max_bin_cap) ** 2 / item + bins ** 2 / (item ** 2)
    score += bins ** 2 / item ** 3
    score[bins > item] = -score[bins > item]
    score[1:] -= score[:-1]
    return score
