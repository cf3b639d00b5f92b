package store

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// hashTag applies Redis Cluster's rule: if the key has a '{' followed later
// by a '}' with at least one byte between them, only that part is hashed.
func hashTag(key string) string {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return key
	}
	end := strings.IndexByte(key[open+1:], '}')
	if end <= 0 {
		return key
	}
	return key[open+1 : open+1+end]
}

func TestKeysMatchTheDesign(t *testing.T) {
	k := InstanceKeys("ALYA", "hostname-1234-1234567890")
	assert.Equal(t, "ALYA_{hostname-1234-1234567890}_HEARTBEAT", k.Heartbeat)
	assert.Equal(t, "ALYA_{hostname-1234-1234567890}_ROWS", k.Rows)
	assert.Equal(t, "ALYA_{hostname-1234-1234567890}_RECOVERY", k.Claim)
	assert.Equal(t, "ALYA_WORKER_REGISTRY", RegistryKey("ALYA"))
	assert.Equal(t, "alive", HeartbeatValue)
}

func TestValidateName(t *testing.T) {
	for _, ok := range []string{"a", "host-1-2", "ALYA", "höst.example_1", strings.Repeat("x", MaxNameLen)} {
		assert.NoError(t, ValidateName(ok), "%q", ok)
	}
	for s, want := range map[string]error{
		"":                                ErrEmpty,
		strings.Repeat("x", MaxNameLen+1): ErrTooLong,
		"a{b":                             ErrBadChars,
		"a}b":                             ErrBadChars,
		"a b":                             ErrBadChars,
		"a\tb":                            ErrBadChars,
		"a\u00a0b":                        ErrBadChars,
		"a\x00b":                          ErrBadChars,
		"a\x7fb":                          ErrBadChars,
		"\xff":                            ErrBadChars,
	} {
		assert.ErrorIs(t, ValidateName(s), want, "%q", s)
	}
}

func TestSanitizeAlwaysGivesAValidName(t *testing.T) {
	assert.Equal(t, "unknown", Sanitize(""))
	assert.Equal(t, "my-host-1", Sanitize("my host{1"))
	assert.NoError(t, ValidateName(Sanitize(strings.Repeat("h", 5000))))
}

func FuzzValidNamesKeepEveryKeyInTheNamesSlot(f *testing.F) {
	for _, s := range []string{"host-1-2", "a{b}", "", " ", "x}", "{", "é", "\xff"} {
		f.Add("ALYA", s)
	}
	f.Fuzz(func(t *testing.T, prefix, id string) {
		if ValidateName(prefix) != nil || ValidateName(id) != nil {
			return
		}
		k := InstanceKeys(prefix, id)
		for _, key := range []string{k.Heartbeat, k.Rows, k.Claim} {
			if got := hashTag(key); got != id {
				t.Fatalf("key %q hashes on %q, want %q", key, got, id)
			}
		}
	})
}

func FuzzSanitize(f *testing.F) {
	for _, s := range []string{"", "host", "a b{c}", "\xff\xfe", strings.Repeat("é", 400)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if err := ValidateName(Sanitize(s)); err != nil {
			t.Fatalf("Sanitize(%q) = %q: %v", s, Sanitize(s), err)
		}
	})
}
