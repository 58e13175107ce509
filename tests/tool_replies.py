"""Replies as each tool-call format's family writes them, and fragments of the families' chat
templates that choose each format: shared by the format tests and the server's."""
from __future__ import annotations

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                            "unit": {"type": "string"}}}
TOOLS = {"get_weather": WEATHER, "add": {"type": "object", "properties": {"a": {"type": "number"},
                                                                         "b": {"type": "number"}}},
         "note": {"type": "object", "properties": {"text": {"type": "string"}, "tags": {"type": "array"}}}}
DS = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{}<｜tool▁sep｜>{}<｜tool▁call▁end｜>"

# (format, reply, content, [(name, arguments)])
REPLIES = [
    ("hermes", 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
               '</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1.5e1, "b": -2}}\n</tool_call>',
     "Checking.\n", [("get_weather", {"city": "Paris", "days": 3}), ("add", {"a": 15.0, "b": -2})]),
    ("qwen3_xml", "I will look it up.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n"
                  "</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
     "I will look it up.\n", [("get_weather", {"city": "New York", "days": 2})]),
    ("qwen3_xml", '<tool_call>\n<function=note>\n<parameter=text>\nline one\n"quoted" \\ line two\n</parameter>\n'
                  '<parameter=tags>\n["a", "b"]\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n'
                  "<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2.5\n</parameter>\n</function>\n"
                  "</tool_call>",
     "", [("note", {"text": 'line one\n"quoted" \\ line two', "tags": ["a", "b"]}), ("add", {"a": 1, "b": 2.5})]),
    ("glm45", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n"
              "<arg_key>days</arg_key>\n<arg_value>5</arg_value>\n</tool_call>",
     "", [("get_weather", {"city": "Beijing", "days": 5})]),
    ("glm45", "Sure.<tool_call>note\n<arg_key>text</arg_key>\n<arg_value>12</arg_value>\n</tool_call>"
              "<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
     "Sure.", [("note", {"text": "12"}), ("add", {"a": 3})]),
    ("kimi_k2", "Let me check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                '<|tool_call_argument_begin|>{"city": "杭州", "unit": "c"}<|tool_call_end|><|tool_call_begin|>'
                'functions.add:1<|tool_call_argument_begin|>{"a":1,"b":2}<|tool_call_end|><|tool_calls_section_end|>',
     "Let me check.", [("get_weather", {"city": "杭州", "unit": "c"}), ("add", {"a": 1, "b": 2})]),
    ("deepseek_v31", "OK" + DS.format("get_weather", '{"city": "Tokyo", "days": 1}')[:-len("<｜tool▁call▁end｜>")]
     + "<｜tool▁call▁end｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{\"a\": 2, \"b\": 3}<｜tool▁call▁end｜>"
     + "<｜tool▁calls▁end｜>", "OK", [("get_weather", {"city": "Tokyo", "days": 1}), ("add", {"a": 2, "b": 3})]),
    ("functiongemma", "<start_function_call>call:get_weather{city:<escape>London, UK<escape>,days:4}"
                      "<end_function_call>", "", [("get_weather", {"city": "London, UK", "days": 4})]),
    ("gemma4", '<|tool_call>call:note{tags:[<|"|>x<|"|>,<|"|>y<|"|>],text:<|"|>a {b} c<|"|>}<tool_call|>',
     "", [("note", {"tags": ["x", "y"], "text": "a {b} c"})]),
    ("granite", '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Rome"}}, '
                '{"name": "add", "arguments": {"a": 1, "b": 1}}]',
     "", [("get_weather", {"city": "Rome"}), ("add", {"a": 1, "b": 1})]),
    ("granite", '[{"name": "add", "arguments": {"a": 0.5, "b": true}}]', "", [("add", {"a": 0.5, "b": True})]),
    ("pythonic", '[get_weather(city="San Francisco", days=7), add(a=1, b=-2.5)]', "",
     [("get_weather", {"city": "San Francisco", "days": 7}), ("add", {"a": 1, "b": -2.5})]),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Oslo", "days": 10}}', "",
     [("get_weather", {"city": "Oslo", "days": 10})]),
    ("mistral", '[TOOL_CALLS][{"name": "note", "arguments": {"text": "é\\u00e9 \\"q\\"", "tags": [1, [2, {}]]}}]',
     "", [("note", {"text": 'éé "q"', "tags": [1, [2, {}]]})]),
    ("hermes", '<tool_call>{"name": "note", "arguments": {"text": "a\\ud83d\\ude00b\\n\\t\\\\ \\/x", "n": -0.5e-3, '
               '"z": [true,false,null,{"k":[]}]}}</tool_call>',
     "", [("note", {"text": "a\U0001F600b\n\t\\ /x", "n": -0.0005, "z": [True, False, None, {"k": []}]})]),
    ("inferred", 'Let me see. <fn_call>{"name": "get_weather", "arguments": {"city": "Lima", "days": 2}}</fn_call>'
                 '<fn_call>{"name": "add", "arguments": {"a": 2}}</fn_call>', "Let me see. ",
     [("get_weather", {"city": "Lima", "days": 2}), ("add", {"a": 2})]),
    ("generic", 'Hm <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call> done', "Hm  done",
     [("add", {"a": 1, "b": 2})]),
]


TEMPLATES = {  # fragments of the families' own chat templates
    "qwen3_xml": "{{- '\\n<tool_call>\\n<function=' + tool_call.name + '>\\n' }}{{- '<parameter=' + args_name + '>\\n' }}",
    "glm45": "{{- '<tool_call>' + tc.name }}{% for k, v in _args.items() %}<arg_key>{{ k }}</arg_key>"
             "<arg_value>{{ v }}</arg_value>{% endfor %}</tool_call>{% if tools %}{% endif %}",
    "kimi_k2": "<|tool_calls_section_begin|>{% for tool_call in message['tool_calls'] %}<|tool_call_begin|>",
    "deepseek_v31": "{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'+ tool['function']['name'] + '<｜tool▁sep｜>'}}",
    "functiongemma": "{{- '<start_function_call>call:' + function['name'] + '{' -}}",
    "gemma4": "{{- '<|tool_call>call:' + function['name'] + '{' -}}",
    "granite": "<|start_of_role|>assistant<|end_of_role|>{% if tools %}<|tool_call|>{{ message.tool_calls | tojson }}{% endif %}",
    "pythonic": "Use exact format: [func_name1(param1=value1, param2=value2), func_name2(...)] <|eot|> {{ tools }}",
    "llama3_json": "<|start_header_id|>ipython<|end_header_id|> {{ tools }} <|eot_id|>",
    "mistral": "[AVAILABLE_TOOLS] {{ tools }} [/AVAILABLE_TOOLS]",
    "generic": "{% for m in messages %}{{ m.content }}{% endfor %}",
    "inferred": "{% for tc in message.tool_calls %}<fn_call>{{ tc.function | tojson }}</fn_call>{% endfor %}",
    "hermes": "{% for tool in tools %}{{ tool | tojson }}{% endfor %}<tool_call>\n{{ x }}\n</tool_call>",
}


