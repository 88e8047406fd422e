"""Best fit: the bin the item leaves least space in (the task's seed program)."""


def priority(item, bins):
    return -(bins - item)
