	vpmullq	%zmm13, %zmm0, %zmm5
	vmovdqa64	%zmm8, %zmm4
	kmovb	%k1, %k2
	vmovdqa64	%zmm0, 264(%rsp)
	vpsrlq	%xmm7, %zmm5, %zmm5
	vpsrlq	$6, %zmm5, %zmm10
	vpandq	%zmm11, %zmm5, %zmm5
	vpgatherqq	(%rdx,%zmm10,8), %zmm4{%k2}
	vpsrlvq	%zmm5, %zmm4, %zmm4
	vpandq	%zmm12, %zmm4, %zmm4
	vptestmq	%zmm4, %zmm4, %k0
	kmovb	%k0, %r9d
	testl	%r9d, %r9d
	movq	(%rsp), %rax
	addq	$1, %r13
	cmpq	%rax, %r13
	vmovdqa64	8(%rsp), %zmm6
	kmovb	%k1, %k6
	vmovdqa64	%zmm8, %zmm4
	leaq	(%r14,%rbx), %rax
	vmovdqa64	%zmm8, %zmm5
	kmovb	%k1, %k7
	vpgatherqq	(%rbx,%zmm6,8), %zmm4{%k6}
	addq	$8, %rbx
	vpgatherqq	(%rax,%zmm6,8), %zmm5{%k7}
	vpsubq	%zmm4, %zmm0, %zmm0
	vpbroadcastq	%r11, %zmm4
	vpmullq	%zmm4, %zmm0, %zmm0
	vpbroadcastq	%xmm3, %zmm4
	vpmullq	%zmm5, %zmm4, %zmm4
	vpaddq	%zmm4, %zmm0, %zmm0
