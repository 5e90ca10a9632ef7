"""How our processes stop: a stop asked for by a signal, made safe to observe from any thread."""
