"""Images in the API process: each vision family's preprocessing (numpy + Pillow, torch-free),
equal to transformers' slow image processors, and the image tokens of its prompt.

`processor.ImageProcessor` is the contract; `select.image_processor_for` picks a family's.
"""
