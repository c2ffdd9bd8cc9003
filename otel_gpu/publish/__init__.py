"""Stage 3, publish: the loop that samples, attributes and hands each snapshot on."""
