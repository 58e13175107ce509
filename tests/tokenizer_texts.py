"""Texts the tokenizer tests (and bench/peers/llama_cpp_agreement.py) tokenize: CORPUS trains a
small BPE vocabulary, TEXTS are the cases each tokenizer must cut as its reference does."""
from __future__ import annotations

CORPUS = [
    "The quick brown fox jumps over the lazy dog. I'm sure they'll say it's fine, don't you think?",
    "Numbers: 12345, 3.14159, 1,000,000 and 2024-01-31; 007 and 9876543210 too.",
    "def f(x):\n    return x**2  # square\n\nfor i in range(10):\n\tprint(i)\n",
    "Unicode: café, naïve, Ångström, 日本語のテキスト, 中文字符, 한국어, русский, العربية, हिन्दी, ไทย",
    "Whitespace   runs,\ttabs\t\tand\nnew\n\nlines\r\nmatter.    Indented    code   ",
    "Emoji 😀🎉👍🏽 and symbols © ® ™ € £ ¥ § ¶ † ‡ • … ‰ ′ ″ ½ ² ³ µ",
    "Punctuation!!! What?! (parens) [brackets] {braces} <angles> \"quotes\" 'single' `tick`",
    "MixedCase CamelCaseWords HTTPServer getHTTPResponse XMLHttpRequest iPhone McDonald's",
    "end.\nnext line!\n\nsé combining e\u0301 marks हिन्दी",
] * 8

TEXTS = [
    "Hello world", "hello, World! How are you?", " leading space", "   three leading spaces",
    "trailing spaces   ", "a  b   c    d     e", "tabs\tand\t\ttwo tabs", "line\nbreak\n\n\nthree",
    "windows\r\nline\r\n\r\nends", "\n\n\n", "   \n   \n", "", " ", "x",
    "1234567890", "12 345 6789 0", "3.14159 2.71828", "1,000,000.00", "x² ½ ³ ٣٤٥ ４５６ ⅷ",
    "2024-01-31T12:34:56Z", "+1 (555) 123-4567", "v1.2.3-rc.4", "0x1F 0b1010 1e-9",
    "I'm you're he's they've we'll she'd IT'S DON'T", "O'Reilly's rock'n'roll", "l'homme aujourd'hui",
    "def f(x):\n    return x ** 2  # square\n", "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "if (a && b || !c) { x = y >> 2 << 3 ^ z | w; }", "SELECT * FROM t WHERE id = 42;",
    "<div class=\"a\">text</div>", "https://example.com/path?q=1&r=two#frag", "a/b/c//d\\e",
    "$PATH ~/.bashrc `cmd` @user #tag %20", "...!!!???---___===+++", "«quotes» „dt“ ‘single’ “double”",
    "café naïve Ångström résumé façade", "e\u0301 combining acute, n\u0303 tilde", "Ελληνικά κείμενο",
    "русский текст, Українська", "עברית العربية فارسی", "हिन्दी देवनागरी বাংলা", "ไทย ລາວ ខ្មែរ",
    "日本語のテキストです。", "中文也可以，对吧？", "한국어 텍스트입니다", "カタカナ ひらがな 漢字",
    "emoji 😀🎉👍🏽 family 👨‍👩‍👧 flags 🇫🇷", "𓀀 hieroglyph 🫠 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math",
    "\u200b zero width \u00a0 nbsp \u3000 ideographic", "MixedCase CamelCaseWords HTTPServer iPhone",
    "ALLCAPS lowercase Titlecase ǅ", "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text", "a<think>reasoning</think>b", "<|im_end|><|im_end|>",
    "<sentinel:12> IMGIMGABCZ", "they'reabout he'sable 'llama", "end.\nnext line!\n\nsé", "\u2581 literal metaspace", "ſ long s and K kelvin", "a" * 40 + " " * 17 + "b",
]
