package redact

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestURLMasksPasswords(t *testing.T) {
	for in, want := range map[string]string{
		"redis://:s3cret@127.0.0.1:6379/0":                    "redis://:xxxxx@127.0.0.1:6379/0",
		"redis://user:s3cret@host:6379":                       "redis://user:xxxxx@host:6379",
		"postgres://app:p%40ss@db:5432/x?sslmode=disable":     "postgres://app:xxxxx@db:5432/x?sslmode=disable",
		"postgres://app@db/x?password=s3cret&sslmode=disable": "postgres://app@db/x?password=xxxxx&sslmode=disable",
		"postgres://app@db/x":                                 "postgres://app@db/x",
		"host=db user=app password='s3 cret' dbname=x":        "host=db user=app password=xxxxx dbname=x",
		"host=db user=app password=s3cret":                    "host=db user=app password=xxxxx",
		"user:s3cret@garbage-without-scheme":                  "xxxxx",
		"127.0.0.1:6379":                                      "127.0.0.1:6379",
		"":                                                    "",
	} {
		got := URL(in)
		assert.Equal(t, want, got, in)
		assert.NotContains(t, got, "s3cret")
		assert.NotContains(t, got, "p@ss")
	}
}

func TestErrorMasksEveryFormOfThePassword(t *testing.T) {
	conn := "postgres://app:p%40ss%2Fw0rd@db:5432/x"
	base := io.ErrUnexpectedEOF
	for _, msg := range []string{
		"connect " + conn + ": refused",
		"password p@ss/w0rd rejected",
		"raw p%40ss%2Fw0rd here",
	} {
		err := Error(fmt.Errorf("%s: %w", msg, base), conn)
		assert.NotContains(t, err.Error(), "p@ss/w0rd", msg)
		assert.NotContains(t, err.Error(), "p%40ss%2Fw0rd", msg)
		assert.Contains(t, err.Error(), Mask)
		assert.True(t, errors.Is(err, base), "the chain is kept")
	}
	assert.Nil(t, Error(nil, conn))
	plain := errors.New("dial tcp 127.0.0.1:1: connection refused")
	assert.Same(t, plain, Error(plain, conn), "nothing to hide: the same error")
}

func TestStringMasksDSNPasswords(t *testing.T) {
	conn := "host=db password='it''s' user=u"
	s := String("bad conn host=db password='it''s' user=u", conn)
	assert.False(t, strings.Contains(s, "it''s"), s)
}

func TestShownLeavesNothingATerminalActsOn(t *testing.T) {
	for in, want := range map[string]string{
		"worker-1":                              "worker-1",
		"a\x1b[2Jb":                             "a [2Jb",
		"\x1b]52;c;cHduZWQ=\x07":                " ]52;c;cHduZWQ= ",
		"x\x9b31my":                             "x?31my", // a C1 byte, not UTF-8
		"x\u009b31my":                           "x 31my", // C1 CSI as UTF-8
		"line\nfake line\r":                     "line fake line ",
		"bidi \u202egnp.exe":                    "bidi  gnp.exe",
		"del\x7f":                               "del ",
		"bad \xff\xfe utf8":                     "bad ?? utf8",
		"ünïcødé ✓":                             "ünïcødé ✓",
		"\ufffd is a character, shown as it is": "\ufffd is a character, shown as it is",
	} {
		assert.Equal(t, want, Shown(in, 0), "%q", in)
	}
	assert.Equal(t, "abc…[3 bytes more]", Shown("abcdef", 3))
	assert.Equal(t, "éé…[4 bytes more]", Shown("éééé", 2), "cut at characters, counted in bytes")
	huge := strings.Repeat("\x1b", 4<<20)
	got := Shown(huge, 0)
	assert.Equal(t, strings.Repeat(" ", MaxShown)+"…[4193792 bytes more]", got)
}
