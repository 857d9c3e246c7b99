	vpmullq	%zmm14, %zmm3, %zmm9
	vmovdqa64	%zmm13, %zmm5
	kmovb	%k2, %k5
	vmovdqa64	%zmm3, 456(%rsp)
	vpsrlq	%xmm8, %zmm9, %zmm9
	vpsrlq	$6, %zmm9, %zmm15
	vpandq	%zmm11, %zmm9, %zmm9
	vpgatherqq	(%rax,%zmm15,8), %zmm5{%k5}
	vpsrlvq	%zmm9, %zmm5, %zmm5
	vpandq	%zmm12, %zmm5, %zmm5
	vptestmq	%zmm5, %zmm5, %k7
	kmovb	%k7, %r8d
	testl	%r8d, %r8d
	vpmullq	%zmm14, %zmm4, %zmm9
	vmovdqa64	%zmm13, %zmm5
	kmovb	%k2, %k6
	vmovdqa64	%zmm4, 456(%rsp)
	vpsrlq	%xmm8, %zmm9, %zmm9
	vpsrlq	$6, %zmm9, %zmm15
	vpandq	%zmm11, %zmm9, %zmm9
	vpgatherqq	(%rax,%zmm15,8), %zmm5{%k6}
	vpsrlvq	%zmm9, %zmm5, %zmm5
	vpandq	%zmm12, %zmm5, %zmm5
	vptestmq	%zmm5, %zmm5, %k7
	kmovb	%k7, %r8d
	testl	%r8d, %r8d
	movq	%rdx, %r13
	movq	(%rsp), %rsi
	addq	$1, %r13
	cmpq	%rsi, %r13
	vpxor	%xmm5, %xmm5, %xmm5
	kmovb	%k0, %k1
	vmovdqa64	72(%rsp), %zmm7
	vmovdqa64	136(%rsp), %zmm2
	vmovdqa	%ymm5, %ymm9
	leaq	(%r10,%rdi), %rcx
	vmovdqa	%ymm5, %ymm15
	vpbroadcastq	-48(%rsp), %zmm17
	kmovb	%k1, %k6
	vmovdqa	%ymm5, %ymm0
	kmovb	%k1, %k4
	vpgatherqd	(%r10,%zmm7,4), %ymm9{%k6}
	vpmovzxdq	%ymm9, %zmm9
	kmovb	%k1, %k3
	vpbroadcastq	%xmm6, %zmm16
	vpgatherqd	(%rcx,%zmm7,4), %ymm15{%k3}
	vpsubq	%zmm9, %zmm3, %zmm3
	vmovdqa	%ymm5, %ymm9
	vpgatherqd	(%rcx,%zmm2,4), %ymm0{%k1}
	vpmovzxdq	%ymm15, %zmm15
	vpmovzxdq	%ymm0, %zmm5
	vpgatherqd	(%r10,%zmm2,4), %ymm9{%k4}
	addq	$4, %r10
	vpmovzxdq	%ymm9, %zmm9
	vpmullq	%zmm17, %zmm3, %zmm3
	vpsubq	%zmm9, %zmm4, %zmm4
	vpmullq	%zmm16, %zmm15, %zmm15
	vpmullq	%zmm17, %zmm4, %zmm4
	vpmullq	%zmm16, %zmm5, %zmm5
	vpaddq	%zmm15, %zmm3, %zmm3
	vpaddq	%zmm5, %zmm4, %zmm4
