package recovery

import "testing"

type resetterUnderTest = RowResetter

func TestDecoratedResetterKeepsEveryGuarantee(t *testing.T) {
	runGuarantees(t, []decoration{
		{"bare", func(r pgResetterAPI) resetterUnderTest { return r }},
		{"metricsResetter", func(r pgResetterAPI) resetterUnderTest { return &metricsResetter{inner: r} }},
		{"fullWrapper", func(r pgResetterAPI) resetterUnderTest { return fullWrapper{r} }},
	})
}
