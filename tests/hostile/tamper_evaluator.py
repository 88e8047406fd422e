# expect: ok
# Monkeypatches the evaluator class so that *later* candidates would get a perfect score.
# With fork-per-candidate the patch dies with this process.
import sys

from_mod = sys.modules.get("atlas.sandbox.testing")
if from_mod is not None:
    def fake(self, code, context):
        from atlas.types import Evaluation
        return Evaluation(score=1e9, passed=True)
    from_mod.ToyEvaluator.__call__ = fake


def policy(contexts, history, t, state):
    return 0
