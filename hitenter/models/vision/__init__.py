"""Vision encoders read from llama.cpp's mmproj GGUF files: the file's config and tensors (mmproj.py), image
decoding under limits (image_input.py), each family's preprocessing (preprocess.py) and towers (gemma3.py;
qwen25vl.py and qwen3vl.py on the shared pieces of qwen_vit.py; pixtral.py; gemma4v.py), chosen by projector
type in loader.py."""
