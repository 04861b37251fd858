"""Vision encoders read from llama.cpp's mmproj GGUF files: the file's config and tensors (mmproj.py), image
decoding under limits (image_input.py), each family's preprocessing (preprocess.py) and towers (gemma3.py)."""
