"""Serving SSD pipelines to many users on Ray Serve, and bulk generation on Ray Data (docs/serving.md).

request.py     the JSON body of POST /generate and its validation by the pipeline's own checks, into a `Job`
batching.py    a batch of jobs on one pipeline: one call per group of identical options, a generator per image
deployment.py  the Ray Serve deployment and its HTTP API (`build_app`); cli.py is `ssd-serve`
bulk.py        `python -m ssd_pipelines.serving.bulk prompts.txt --out DIR`: many prompts on Ray Data, resumable

Only deployment.py, cli.py and bulk.py import Ray (`pip install -e ".[serve]"`).
"""
