"""`python -m ddtree_jax.generate`: the command line (`ddtree_jax.cli`)."""
from ddtree_jax.cli import main
from ddtree_jax.errors import run_script

if __name__ == "__main__":
    run_script(main, prog="ddtree_jax.generate")
