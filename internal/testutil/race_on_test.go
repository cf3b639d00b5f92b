//go:build race

package testutil

const raceBuild = true
