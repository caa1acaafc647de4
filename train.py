"""`python train.py model=causal_lm norm=rms ...` — see README.md and conf/train.yaml."""

from attnlab.cli.train import main

if __name__ == "__main__":
    main()
