# expect: ok
# Monkeypatches the toy task's scorer class and its score helper, wherever this process holds
# them, so that *later* candidates would get a perfect score. The scorer runs in another
# process, and with fork-per-candidate the patch dies with this one.
import sys

from_mod = sys.modules.get("atlas.sandbox.testing")
if from_mod is not None:
    def fake(*args, **kwargs):
        from atlas.types import Evaluation
        return Evaluation(score=1e9, passed=True)
    from_mod.ToyScorer.score = fake
    from_mod.toy_score = fake


def policy(contexts, history, t, state):
    return 0
