// Package redact keeps credentials out of what the module's programs print:
// connection strings for display, and error messages that may quote them;
// and it keeps strings from outside (Redis) from acting on a terminal
// (Shown).
package redact

import (
	"net/url"
	"regexp"
	"strings"
)

// Mask replaces a secret in printed text.
const Mask = "xxxxx"

// dsnPassword matches password=... in a key=value connection string
// (PostgreSQL's "host=h user=u password='p w'").
var dsnPassword = regexp.MustCompile(`password\s*=\s*('(?:[^'\\]|\\.)*'|[^\s]+)`)

// URL returns conn fit to print: a URL with its password (in the user
// information or a password query parameter) replaced by Mask; a key=value
// string with its password value masked; anything else that carries a
// secret as Mask alone.
func URL(conn string) string {
	if conn == "" {
		return ""
	}
	if u, err := url.Parse(conn); err == nil && u.Scheme != "" && u.Host != "" {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), Mask)
		}
		if q := u.Query(); q.Has("password") {
			q.Set("password", Mask)
			u.RawQuery = q.Encode()
		}
		return u.Redacted()
	}
	if dsnPassword.MatchString(conn) {
		return dsnPassword.ReplaceAllString(conn, "password="+Mask)
	}
	if strings.Contains(conn, "@") {
		return Mask // unparseable, and may hold user:password@
	}
	return conn
}

// Secrets returns the strings of conn that must never be printed: its
// password in every form it may appear in (as written, decoded), longest
// first.
func Secrets(conn string) []string {
	var out []string
	add := func(s string) {
		if s != "" && s != Mask {
			out = append(out, s)
		}
	}
	if u, err := url.Parse(conn); err == nil {
		if p, has := u.User.Password(); has {
			add(p)
			add(url.QueryEscape(p))
			add(url.PathEscape(p))
			// As written between ':' and '@'.
			if ui := strings.SplitN(strings.TrimPrefix(conn, u.Scheme+"://"), "@", 2); len(ui) == 2 {
				if _, raw, ok := strings.Cut(ui[0], ":"); ok {
					add(raw)
				}
			}
		}
		add(u.Query().Get("password"))
	}
	for _, m := range dsnPassword.FindAllStringSubmatch(conn, -1) {
		add(m[1])
		add(strings.Trim(m[1], "'"))
	}
	// Longest first, so a secret that contains another is replaced whole.
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && len(out[j]) > len(out[j-1]); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// Error returns err with the secrets of every connection string in conns
// (and each whole connection string) masked in its message; nil for nil.
// errors.Is and errors.As still see the original chain.
func Error(err error, conns ...string) error {
	if err == nil {
		return nil
	}
	msg := String(err.Error(), conns...)
	if msg == err.Error() {
		return err
	}
	return &redacted{msg: msg, err: err}
}

// String masks in s every connection string of conns (shown as URL shows
// it) and every secret they carry.
func String(s string, conns ...string) string {
	for _, c := range conns {
		if c == "" {
			continue
		}
		if shown := URL(c); shown != c {
			s = strings.ReplaceAll(s, c, shown)
		}
		for _, secret := range Secrets(c) {
			s = strings.ReplaceAll(s, secret, Mask)
		}
	}
	return s
}

type redacted struct {
	msg string
	err error
}

func (e *redacted) Error() string { return e.msg }
func (e *redacted) Unwrap() error { return e.err }
