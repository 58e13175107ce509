"""Random encoders written by transformers itself (its real model classes) for the retrieval
tests and bench/embeddings.py: BERT (a WordPiece vocabulary trained here) and XLM-RoBERTa (a
SentencePiece unigram model trained here) embedders saved through sentence-transformers with
their pooling, cross-encoders of both, and a bge-small-shaped BERT; and llama.cpp's GGUF of each.
Torch-free at import; needs transformers and sentence-transformers (test dependencies)."""
from __future__ import annotations

import os
from pathlib import Path

TEXTS = ["the quick brown fox jumps over the lazy dog", "hello world", "a dog sleeps in the sun all day long",
         "what is the capital of france", "paris is the capital and largest city of france",
         "berlin is the capital of germany", "foxes are small omnivorous mammals"]
CORPUS = TEXTS * 20 + ["sphinx of black quartz judge my vow", "pack my box with five dozen liquor jugs"] * 20
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=128)
BGE_SMALL = dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=12, intermediate_size=1536,
                 max_position_embeddings=512)
# name -> (architecture, pooling, normalize, labels, shape)
SPECS = {
    "bert-mean": ("bert", "mean", True, 0, SMALL),
    "bert-cls": ("bert", "cls", False, 0, SMALL),
    "xlmr-mean": ("xlm-roberta", "mean", True, 0, SMALL),
    "bert-rerank": ("bert", None, False, 1, SMALL),
    "xlmr-rerank": ("xlm-roberta", None, False, 1, SMALL),
    "bge-small-shape": ("bert", "cls", True, 0, BGE_SMALL),
    "nomic-mean": ("nomic-bert", "mean", True, 0, SMALL),
}


def encoder_dir(name: str, root: Path) -> Path:
    """The HF directory under root/encoders (a folder of its own, so llama.cpp's GGUF of it is
    written beside it)."""
    out = Path(root) / "encoders" / name / name
    if not (out / ".done").is_file():
        _write(name, out)
    return out


def _write(name: str, out: Path) -> None:
    import shutil
    import tempfile

    arch, pooling, normalize, labels, shape = SPECS[name]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent))
    model, tokenizer = _model(arch, labels, shape, seed=sum(map(ord, name)))
    if labels:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    else:
        _save_sentence_transformer(model, tokenizer, tmp, pooling, normalize)
    if getattr(tokenizer, "spm_model", None):
        (tmp / "sentencepiece.bpe.model").write_bytes(tokenizer.spm_model)
    (tmp / ".done").write_text("")
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)


def _model(arch: str, labels: int, shape: dict, seed: int):
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    if arch == "bert":
        tokenizer = _wordpiece()
        config = tf.BertConfig(vocab_size=len(tokenizer), **shape, num_labels=max(labels, 1))
        cls = tf.BertForSequenceClassification if labels else tf.BertModel
    elif arch == "nomic-bert":
        tokenizer = _wordpiece()
        config = tf.NomicBertConfig(vocab_size=len(tokenizer), **shape)
        cls = tf.NomicBertModel
    else:
        tokenizer = _unigram()
        config = tf.XLMRobertaConfig(vocab_size=len(tokenizer), **{**shape, "max_position_embeddings": shape[
            "max_position_embeddings"] + 2}, type_vocab_size=1,
                                     pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                                     eos_token_id=tokenizer.eos_token_id, num_labels=max(labels, 1))
        cls = tf.XLMRobertaForSequenceClassification if labels else tf.XLMRobertaModel
    model = cls(config).eval()
    with torch.no_grad():  # random init is small; wider weights make the vectors differ more
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, min(0.2, 2.0 / p.shape[-1] ** 0.5))
    return model, tokenizer


def _wordpiece():
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(CORPUS, trainers.WordPieceTrainer(vocab_size=300, special_tokens=specials))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return BertTokenizerFast(tokenizer_object=tok)


def _unigram():
    """XLM-R's tokenizer over a SentencePiece unigram model trained here; the model file is kept
    beside it (llama.cpp's converter reads sentencepiece.bpe.model)."""
    import io

    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2
    from transformers import XLMRobertaTokenizer

    blob = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS), model_writer=blob, vocab_size=120,
                                   model_type="unigram", character_coverage=1.0, hard_vocab_limit=False,
                                   minloglevel=2)
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(blob.getvalue())
    # fairseq's layout: <s> <pad> </s> <unk>, the pieces after SentencePiece's own three, <mask>
    vocab = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    vocab += [(p.piece, p.score) for p in proto.pieces[3:]] + [("<mask>", 0.0)]
    tok = XLMRobertaTokenizer(vocab=vocab, _spm_precompiled_charsmap=proto.normalizer_spec.precompiled_charsmap)
    tok.spm_model = blob.getvalue()
    return tok


def _save_sentence_transformer(model, tokenizer, out: Path, pooling: str, normalize: bool) -> None:
    from sentence_transformers import SentenceTransformer

    st = _sentence_modules()

    staged = out / "hf"
    model.save_pretrained(staged)
    tokenizer.save_pretrained(staged)
    modules = [st.Transformer(str(staged)), st.Pooling(model.config.hidden_size, pooling_mode=pooling)]
    SentenceTransformer(modules=modules + ([st.Normalize()] if normalize else [])).save(str(out))
    import shutil

    shutil.rmtree(staged)


CONVERTER_FLAGS = {"embedding-gemma": ("--sentence-transformers-dense-modules",)}


def encoder_gguf(name: str, root: Path, outtype: str = "f32") -> Path:
    """llama.cpp's GGUF of an encoder fixture, written once beside it (raises
    ConverterUnavailable where its converter cannot be had)."""
    from mlxr.testing.llama_cpp_convert import convert, llama_cpp_tree

    hf = embedding_gemma_dir(root) if name == "embedding-gemma" else encoder_dir(name, root)
    if SPECS.get(name, ("",))[0] == "nomic-bert":  # the converter reads nomic-ai's own layout
        from mlxr.testing.nomic_layout import nomic_original_dir

        hf = nomic_original_dir(hf)
    out = hf.parent / f"llama-cpp-{outtype}.gguf"
    if out.is_file():
        return out
    # the converter's own vocabulary code: encoders' WordPiece and SentencePiece vocabularies are
    # what it reads
    convert(llama_cpp_tree(Path(root)), hf, out, outtype, CONVERTER_FLAGS.get(name, ()), pre_fallback="default",
            bpe_vocab=False)
    return out


def decoder_embedder_dir(root: Path) -> Path:
    """Qwen3-Embedding's layout on the tiny random Qwen3 (arch_fixtures): sentence-transformers
    saves the bare backbone (no lm_head, so the embeddings are tied, as in the real config)
    with last-token pooling and normalisation."""
    import json
    import shutil
    import tempfile

    from mlxr.testing.arch_fixtures import arch_fixture_dir

    out = Path(root) / "encoders" / "qwen3-embed" / "qwen3-embed"
    if (out / ".done").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent))
    st = _sentence_modules()
    from sentence_transformers import SentenceTransformer

    modules = [st.Transformer(str(arch_fixture_dir("tiny-qwen3", root))), st.Pooling(64, pooling_mode="lasttoken"),
               st.Normalize()]
    SentenceTransformer(modules=modules).save(str(tmp))
    config = json.loads((tmp / "config.json").read_text())
    (tmp / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}, indent=2))
    (tmp / ".done").write_text("")
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    return out


def _sentence_modules():
    import warnings

    with warnings.catch_warnings():  # 6.x moved the modules; this path works from 3.x on
        warnings.simplefilter("ignore", DeprecationWarning)
        from sentence_transformers import models

    return models


def qwen3_reranker_dir(root: Path, tied: bool = False) -> Path:
    """Qwen3-Reranker's layout on a tiny random Qwen3: a causal LM whose vocabulary has "yes"
    and "no" tokens, in a folder named as the real model is (how its kind is recognised);
    tied: its head is the embedding (the real 0.6B and 4B), else its own (the 8B)."""
    import json
    import shutil
    import tempfile

    import torch
    import transformers as tf
    from tokenizers import Tokenizer

    from mlxr.testing.arch_fixtures import ARCH_FIXTURES, arch_fixture_dir

    kind = "-tied" if tied else ""
    out = Path(root) / "encoders" / f"qwen3-reranker{kind}" / f"Qwen3-Reranker-tiny{kind}"
    if (out / ".done").is_file():
        return out
    base = arch_fixture_dir("tiny-qwen3", root)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent))
    tok = Tokenizer.from_file(str(base / "tokenizer.json"))
    tok.add_tokens(["yes", "no"])
    config = {**ARCH_FIXTURES["tiny-qwen3"].config, "vocab_size": tok.get_vocab_size(), "tie_word_embeddings": tied}
    torch.manual_seed(47)
    model = tf.Qwen3ForCausalLM(tf.Qwen3Config(**config)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.1)
    model.save_pretrained(tmp)
    for name in ("tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (base / name).is_file():
            shutil.copy(base / name, tmp / name)
    tok.save(str(tmp / "tokenizer.json"))
    json.loads((tmp / "config.json").read_text())  # written whole
    (tmp / ".done").write_text("")
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    return out


def embedding_gemma_dir(root: Path) -> Path:
    """EmbeddingGemma's layout on a tiny random Gemma 3 (the tiny-gemma3 fixture's shape and
    tokenizer, 6 layers with a window of 8): Gemma3TextModel run bidirectionally, saved through
    sentence-transformers with mean pooling, two bias-free Dense projections and Normalize."""
    import shutil
    import tempfile

    import torch
    import transformers as tf

    from mlxr.testing.fixtures import CONFIGS, fixture_paths

    out = Path(root) / "encoders" / "embedding-gemma" / "embedding-gemma"
    if (out / ".done").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent))
    keys = {k: v for k, v in CONFIGS["tiny-gemma3"].config.items() if k not in ("architectures", "model_type",
                                                                                 "torch_dtype")}
    torch.manual_seed(48)
    model = tf.Gemma3TextModel(tf.Gemma3TextConfig(**keys, use_bidirectional_attention=True)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1 if p.dim() == 1 else min(0.2, 2.0 / p.shape[-1] ** 0.5))
    staged = tmp / "hf"
    model.save_pretrained(staged)
    tf.AutoTokenizer.from_pretrained(str(fixture_paths("tiny-gemma3", root).hf_dir)).save_pretrained(staged)
    # no chat template: sentence-transformers 6 would wrap every text in a user turn
    (staged / "chat_template.jinja").unlink(missing_ok=True)
    _save_embedding_gemma(staged, tmp, model.config.hidden_size)
    shutil.rmtree(staged)
    (tmp / ".done").write_text("")
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    return out


def _save_embedding_gemma(staged: Path, out: Path, hidden: int) -> None:
    import torch
    from sentence_transformers import SentenceTransformer

    st = _sentence_modules()
    dense = [st.Dense(hidden, 2 * hidden, bias=False, activation_function=torch.nn.Identity()),
             st.Dense(2 * hidden, hidden, bias=False, activation_function=torch.nn.Identity())]
    modules = [st.Transformer(str(staged)), st.Pooling(hidden, pooling_mode="mean"), *dense, st.Normalize()]
    SentenceTransformer(modules=modules).save(str(out))
