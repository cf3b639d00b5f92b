package redact

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxShown is how many characters of a string from outside (Redis, an
// error) Shown keeps for one line: as long as the longest valid key name
// part, so an instance ID is never clipped.
const MaxShown = 512

// Shown returns s fit to print on a terminal, whoever wrote it: each
// invalid UTF-8 byte becomes '?'; each control character (C0 such as
// ESC, BEL and newline, DEL, C1 such as CSI and OSC), Unicode format
// character (bidirectional overrides) and line or paragraph separator
// becomes a space, so no escape sequence, OSC 52 clipboard write or
// forged line survives; and past max characters (MaxShown unless max is
// positive) it is cut, with "…[N bytes more]" saying how much was left
// out. It reads no more of s than it keeps, so a value of megabytes costs
// what its first max characters do. Every string recoveryctl shows from
// Redis goes through it, in text and JSON alike.
func Shown(s string, max int) string {
	if max <= 0 {
		max = MaxShown
	}
	var b strings.Builder
	b.Grow(min(len(s), 4*max))
	n := 0
	for i := 0; i < len(s); n++ {
		if n == max {
			b.WriteString("…[" + strconv.Itoa(len(s)-i) + " bytes more]")
			break
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			b.WriteByte('?')
		case unsafeRune(r):
			b.WriteByte(' ')
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// unsafeRune reports whether a terminal may act on r rather than show it.
func unsafeRune(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029'
}
