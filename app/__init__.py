"""The Gradio demo: watch SSD draw an image row by row, see where its drafts were accepted, compare it with AR.

The demo is a thin layer over `SSDAutoregressivePipeline`: `runner` calls the
pipeline in a worker thread and streams its committed rows, `render` turns
codes and statistics into pictures and tables, `events` maps one button press
to those updates, `ui` lays out the page and `cli` loads the model and serves it.
"""
