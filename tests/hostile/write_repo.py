# expect: exception
# REPO_DIR is replaced by the test with the repository root.
import pathlib


def policy(contexts, history, t, state):
    pathlib.Path("REPO_DIR/atlas_hostile_repo.txt").write_text("pwned")
    return 0
