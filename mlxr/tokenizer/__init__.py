"""Text to token ids and back: the Tokenizer the engine and server use (tokenizer.py), built from
a tokenizer.json, a SentencePiece model file (sentencepiece_file.py) or a GGUF file's vocabulary
(gguf_vocab.py with its pre-tokenizers, Unigram and WordPiece builders). No torch."""
