"""Stand-in for ComfyUI's `comfy` package: only the modules and names the SSD node pack uses."""
