"""XLM-RoBERTa and RoBERTa encoders (bge-m3, multilingual-e5, bge-reranker): BERT's anatomy;
positions start past the padding id (models/bert.position_offset), one token type. Their GGUF
files are llama.cpp's "bert" with the unused position rows dropped, so they load as BERT."""
from __future__ import annotations

from mlxr.models.arch import Architecture
from mlxr.models.bert import BertModel, bert_hf_fields, encoder_hf_config

MODEL = BertModel
ARCH = Architecture("xlm-roberta", ("xlm-roberta", "roberta", "camembert"), (), hf_config=encoder_hf_config,
                    hf_fields=bert_hf_fields, hf_max_positions=514)
