"""Compare: before vs after (diff), slow vs fast (summary/slow), and the words for both."""
